"""Where a run's files are, whatever its task does to the working directory, and the flag values the dry run accepts:
each one runs, or is refused in one line before anything loads (issue 69, items 1 and 5)."""
import os

import pytest

import tasks
import train
from harness import checkpoint, flags as flags_module
from tests.stubs import SMALL_TRAIN as SMALL, DigitsTask

pytestmark = pytest.mark.usefixtures("digits_task")


class Wanderer(DigitsTask):
    """A task that changes the working directory, as a sandboxing verifier does: in examples() (called while the
    run settles) and in every reward."""
    elsewhere = None

    def examples(self, split, n, seed):
        os.chdir(self.elsewhere)
        return super().examples(split, n, seed)

    def reward(self, completion, example, style="chat"):
        os.chdir(self.elsewhere)
        return super().reward(completion, example, style)


def test_a_task_that_changes_the_working_directory_moves_none_of_the_runs_files(tmp_path, monkeypatch):
    # f80a5bd: the lock, checkpoints, `latest`, metrics and warm-start cache went under the new working directory
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setattr(Wanderer, "elsewhere", str(elsewhere))
    monkeypatch.setitem(tasks.TASKS, "wanderer", lambda data=None: Wanderer())
    flags = ["--task", "wanderer", *SMALL, "--output-dir", "run", "--warm-start-cache", "cache"]
    train.main([*flags, "--steps", "2", "--save-every", "1", "--warm-start-steps", "2"])
    assert os.listdir(elsewhere) == []
    run = home / "run"
    assert {".lock", "metrics.jsonl", "latest", "checkpoint-1", "checkpoint-2"} <= set(os.listdir(run))
    assert os.path.realpath(run / "latest") == str(run / "checkpoint-2")
    assert [name for name in os.listdir(home / "cache") if name.startswith("warm_start-")]
    saved = flags_module.saved_config(str(run / "checkpoint-2"))
    assert saved.output_dir == str(run) and saved.initial_policy.startswith(str(home / "cache"))
    os.chdir(home)  # the resume, from where the run was started, moves nothing either
    train.main(["--resume", "run", "--task", "wanderer", "--steps", "3"])
    assert os.listdir(elsewhere) == [] and checkpoint.checkpoint_steps(str(run))[-1] == 3


def test_the_folders_are_absolute_from_the_command_line_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parsed = flags_module.parse_args(["--output-dir", "a/../run", "--warm-start-cache", "cache"])
    assert (parsed.output_dir, parsed.warm_start_cache) == (str(tmp_path / "run"), str(tmp_path / "cache"))


@pytest.mark.parametrize("flags, message", [
    (["--threads", "100000"], "--threads must lie in [1, 1024]"),  # f80a5bd: libgomp failed, then a segfault
    (["--threads", "0"], "--threads must lie in [1, 1024]"),
    (["--save-every", "1" + "0" * 30], "--save-every must lie within +-(2**63 - 1)"),
    (["--micro-batch", "1" + "0" * 30], "--micro-batch must lie within"),  # torch: Overflow unpacking long long
    (["--max-prompt-length", "1" + "0" * 400], "--max-prompt-length must lie within"),
    (["--lora-rank", "2", "--lora-alpha", "1e30"], "--lora-alpha must lie in (0, 1000 x --lora-rank]"),  # nan
    (["--lora-rank", "2", "--lora-alpha", "0"], "--lora-alpha must lie in (0, 1000 x --lora-rank]")])
def test_a_flag_value_the_run_cannot_take_is_refused_by_the_dry_run_too(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), "--dry-run", *flags])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("train.py: error:") and message in err
    assert len(err.splitlines()) == 1 and not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("flag", ["--warm-start-cache", "--output-dir"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_folder_flag_that_names_a_file_is_one_line(tmp_path, capsys, flag, dry_run):
    # f80a5bd: --warm-start-cache naming a file was a traceback (NotADirectoryError) after the dry run accepted it
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    argv = ["--task", "digits", *SMALL, "--steps", "1", "--output-dir", str(tmp_path / "run"), flag, str(path)]
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv + (["--dry-run"] if dry_run else []))
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err == f"train.py: error: {flag} {path} is a file, not a folder; name a " \
        "folder (it is created if missing)"
    assert path.read_text() == "mine"


def test_a_thread_count_within_the_bound_runs(tmp_path):
    train.main(["--task", "digits", *SMALL, "--steps", "1", "--output-dir", str(tmp_path / "run"), "--threads", "3"])
    assert checkpoint.checkpoint_steps(str(tmp_path / "run")) == [1]
