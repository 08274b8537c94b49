"""The small train.py run and the one-line-error checks the run-safety test files share (test_run_safety.py,
test_run_folder.py, test_run_flags.py)."""
import pytest

import train
from tests.stubs import SMALL_TRAIN as SMALL


def run(out, *extra):
    return train.main(["--task", "digits", "--output-dir", str(out), *SMALL, *extra])


def one_line_error(capsys, exit_info, code):
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]  # the progress bar may precede it
    assert exit_info.value.code == code and "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith("train.py: error:")
    return errors[0]


def fails(capsys, argv, code=1):
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    return one_line_error(capsys, exit_info, code)


@pytest.fixture
def finished_run(tmp_path):
    out = tmp_path / "run"
    run(out, "--steps", "4", "--save-every", "2", "--keep-checkpoints", "0")
    return str(out)
