"""--report-to (harness/report.py): TensorBoard's event files, read back with tensorboard's own reader, hold exactly
metrics.jsonl's numbers; W&B in offline mode writes its run, which a resumed run continues."""
import contextlib
import errno
import glob
import json
import os
import subprocess
import sys

import pytest

from harness import checkpoint, metrics, report
import train
from tests.stubs import SMALL_TRAIN as SMALL

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(out, *extra):
    return train.main(["--task", "countdown", "--output-dir", str(out), *SMALL, "--steps", "4", "--save-every", "2",
                       *extra])


def tensorboard_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(folder, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events, {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_tensorboard_holds_every_metrics_row(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    run(out, "--report-to", "tensorboard")
    events, scalars = tensorboard_scalars(str(out / "tensorboard"))
    rows = metrics.read_metrics(str(out / "metrics.jsonl"))
    expected = {(("eval/" if r.get("eval") else "train/") + key, r["step"]): float(value) for r in rows
                for key, value in r.items() if key not in ("step", "eval")}
    got = {(tag, step): value for tag, values in scalars.items() for step, value in values.items()}
    assert set(got) == set(expected) and len(expected) > 50
    assert all(got[key] == pytest.approx(value, rel=1e-6, abs=1e-12) for key, value in expected.items())  # float32
    assert "eval/samples/text_summary" in events.Tags()["tensors"]  # the completions table of each eval


def test_a_resumed_run_replaces_the_later_steps_in_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    run(out, "--report-to", "tensorboard")
    train.main(["--resume", str(out / "checkpoint-2"), "--steps", "4", "--seed", "0"])
    _, scalars = tensorboard_scalars(str(out / "tensorboard"))
    rows = [r for r in metrics.read_metrics(str(out / "metrics.jsonl")) if not r.get("eval")]
    assert sorted(scalars["train/reward_mean"]) == [1, 2, 3, 4]  # each step once: purge_step hid the old 3, 4
    assert [scalars["train/update_s"][r["step"]] for r in rows] == pytest.approx([r["update_s"] for r in rows])


def test_wandb_offline_writes_its_run_and_a_resume_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    run(out, "--report-to", "wandb", "--steps", "2")
    run_id = json.load(open(out / "checkpoint-2" / "run.json"))["wandb_run_id"]
    assert len(run_id) == 8 and glob.glob(str(out / "wandb" / "offline-run-*" / f"run-{run_id}.wandb"))
    train.main(["--resume", str(out), "--steps", "3"])
    assert len(glob.glob(str(out / "wandb" / "offline-run-*" / f"run-{run_id}.wandb"))) == 2  # the same run id


def test_a_missing_logger_or_unknown_one_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec  # as if tensorboard were not installed: found missing before the model loads
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    monkeypatch.setattr(train.policy, "build_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_info:
        run(tmp_path / "run", "--report-to", "tensorboard")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--report-to tensorboard needs tensorboard: pip install tensorboard" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit):
        run(tmp_path / "run2", "--report-to", "mlflow")
    assert "--report-to takes tensorboard and/or wandb, comma-separated, got 'mlflow'" in capsys.readouterr().err


def test_a_logger_named_twice_is_one_line(tmp_path, capsys):
    # --report-to tensorboard,tensorboard wrote every series twice
    with pytest.raises(SystemExit) as exit_info:
        run(tmp_path / "run", "--report-to", "tensorboard,tensorboard")
    assert exit_info.value.code == 2 and "--report-to names a logger twice (tensorboard,tensorboard)" in \
        capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")


def test_overwrite_deletes_the_old_loggers_files(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    run(out, "--report-to", "tensorboard", "--steps", "2")
    run(out, "--steps", "2", "--overwrite")
    assert not os.path.exists(out / "tensorboard")


@contextlib.contextmanager
def small_disk(folder, size):
    """A tmpfs of `size` mounted at `folder` (a real full disk); skips where mounting is not permitted (not root)."""
    os.makedirs(folder, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize("when", ["full at the start", "fills during the run"])
def test_a_full_disk_under_the_tensorboard_folder_is_one_line(tmp_path, when):
    # SummaryWriter's OSError at the start, or its writer thread's mid-run, was a traceback (two: the thread's too)
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    with small_disk(out / "tensorboard", "4k" if when == "full at the start" else "24k"):
        if when == "full at the start":
            with contextlib.suppress(OSError), open(out / "tensorboard" / "filler", "wb") as f:
                f.write(b"x" * 8192)
        proc = subprocess.run([sys.executable, "train.py", "--task", "countdown", "--output-dir", str(out), *SMALL,
                               "--steps", "40", "--save-every", "1", "--idle-stop", "0", "--report-to",
                               "tensorboard"], cwd=REPO, capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error") or "Error" in line]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert errors[0].startswith("train.py: error: could not write") and "tensorboard" in errors[0]
    assert "No space left on device" in errors[0] and "free some disk space" in errors[0]
    if when == "full at the start":  # the loggers open before the folder changes
        assert not (out / "metrics.jsonl").exists()
    else:
        assert "continue with --resume" in errors[0] and checkpoint.checkpoint_steps(str(out))


@pytest.mark.parametrize("when", ["full at the start", "fills during the run"])
def test_a_full_disk_under_the_wandb_folder_is_one_line(tmp_path, when):
    # W&B's own log handler printed a traceback for each write that failed (140 in a 2-step run), and a fresh run
    # left a metrics.jsonl behind (its first eval's table failed after the row was written)
    pytest.importorskip("wandb")
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    with small_disk(out / "wandb", "4k" if when == "full at the start" else "128k"):
        if when == "full at the start":
            with contextlib.suppress(OSError), open(out / "wandb" / "filler", "wb") as f:
                f.write(b"x" * 8192)
        proc = subprocess.run([sys.executable, "train.py", "--task", "countdown", "--output-dir", str(out), *SMALL,
                               "--steps", "40", "--save-every", "1", "--idle-stop", "0", "--report-to", "wandb"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error") or "Error" in line]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert errors[0].startswith("train.py: error: could not write") and str(out / "wandb") in errors[0]
    assert "No space left on device" in errors[0] and "free some disk space" in errors[0]
    if when == "full at the start":  # nothing in the folder claims a run: the same command starts once there is room
        assert checkpoint.holds_a_run(str(out)) == []
    else:  # every step up to the last checkpoint is in metrics.jsonl: --resume goes on from there
        assert "continue with --resume" in errors[0]
        steps = [row["step"] for row in metrics.read_metrics(str(out / "metrics.jsonl")) if not row.get("eval")]
        assert checkpoint.checkpoint_steps(str(out)) and steps[-1] >= checkpoint.checkpoint_steps(str(out))[-1]


def test_a_disk_that_w_and_bs_own_process_fills_is_seen_after_the_row(tmp_path):
    # wandb-core writes the run's .wandb file and tells this process of none of its failed writes (the file was cut
    # short without a word): a disk with no room left under wandb/ is taken as its error, raised once
    folder = tmp_path / "wandb"
    with small_disk(folder, "8k"):
        writer = report.WandB(None, None, str(folder))
        writer.raise_failed_write()  # room left: nothing to say
        with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
            f.write(b"x" * 16384)
        with pytest.raises(OSError) as error:
            writer.raise_failed_write()
        writer.raise_failed_write()  # said once: closing the run adds nothing
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(folder)
