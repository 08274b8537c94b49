"""A run's lifecycle, tried as a user would: --resume alone, conflicting flags, kills and full disks, corrupt files,
Ctrl-C, and the numbers that used to be silently wrong. Each failure is one line naming the file and what to do."""
import errno
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness import checkpoint, files, manifest, metrics
from harness import run as run_module
import train
from tests.stubs import SMALL_TRAIN as SMALL

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("digits_task")


def run(out, *extra):
    return train.main(["--task", "digits", "--output-dir", str(out), *SMALL, *extra])


def rows_of(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def weights(path):
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def one_line_error(capsys, exit_info, code=1):
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]  # the progress bar may precede it
    assert exit_info.value.code == code and "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith("train.py: error:") and err.rstrip().endswith(errors[0])
    return errors[0]


@pytest.fixture
def finished_run(tmp_path):
    out = tmp_path / "run"
    run(out, "--steps", "4", "--save-every", "2", "--keep-checkpoints", "0")
    return str(out)


# --- --resume continues *that* run ----------------------------------------------------------------------------------
def test_resume_alone_continues_that_run_in_its_own_folder(finished_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --output-dir (runs/default) would be here
    full = rows_of(finished_run)
    train.main(["--resume", os.path.join(finished_run, "checkpoint-2")])
    assert not os.path.exists(tmp_path / "runs")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in run_module.TIMING_KEYS} for r in rows]  # noqa: E731
    assert strip(rows_of(finished_run)) == strip(full)  # same steps (4, not the default 100), same numbers


@pytest.mark.parametrize("flag", [["--task", "countdown"], ["--tiny-hidden", "64"], ["--method", "grpo"],
                                  ["--output-dir", "elsewhere"], ["--task-option", "num_count=3"]])
def test_a_flag_that_conflicts_with_the_saved_run_is_one_line(finished_run, capsys, flag):
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", finished_run, *flag])
    assert "conflicts with the run being resumed" in one_line_error(capsys, exit_info)
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before  # nothing touched


def test_resume_of_a_finished_run_evaluates_the_final_weights(finished_run, capsys):
    capsys.readouterr()
    result = train.main(["--resume", finished_run])  # the run folder itself: its latest checkpoint
    assert "after RL (step 4)" in capsys.readouterr().out
    last_eval = [r for r in rows_of(finished_run) if r.get("eval")][-1]
    assert last_eval["step"] == 4 and result["after"] == {k: last_eval[k] for k in result["after"]}


def test_steps_may_be_extended_on_resume(finished_run):
    train.main(["--resume", finished_run, "--steps", "5"])
    assert [r["step"] for r in rows_of(finished_run) if not r.get("eval")] == [1, 2, 3, 4, 5]


def test_resume_of_a_missing_path_is_one_line_and_fast(tmp_path):
    start = time.time()
    proc = subprocess.run([sys.executable, "train.py", "--resume", str(tmp_path / "nope")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == f"train.py: error: --resume {tmp_path / 'nope'}: no such folder"
    assert time.time() - start < 30  # no torch import, no hub retries (typically well under a second)


def test_help_does_not_import_torch():
    code = ("import runpy, sys\nsys.argv = ['train.py', '--help']\ntry:\n    runpy.run_path('train.py', run_name="
            "'__main__')\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules, 'transformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "False False"


def test_an_unreachable_hub_id_is_one_line_without_retries(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.time()
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--output-dir", str(tmp_path), "--model", "no-such-org/no-such-model"])
    assert "pass a local folder" in one_line_error(capsys, exit_info, code=2)
    assert time.time() - start < 10


# --- kills, full disks, corrupt files -------------------------------------------------------------------------------
def test_a_kill_during_the_metrics_rewrite_leaves_the_old_file(finished_run, monkeypatch):
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()

    def killed(src, dst):
        raise KeyboardInterrupt  # the process dies between writing the temporary file and renaming it
    monkeypatch.setattr(checkpoint.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        train.main(["--resume", os.path.join(finished_run, "checkpoint-2")])
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before


def test_a_half_written_last_row_is_dropped_with_a_warning(finished_run, capsys):
    with open(os.path.join(finished_run, "metrics.jsonl"), "a") as f:
        f.write('{"step": 5, "rew')  # disk full mid-write
    train.main(["--resume", os.path.join(finished_run, "checkpoint-4"), "--steps", "5"])
    assert "dropped a half-written last row" in capsys.readouterr().out
    assert [r["step"] for r in rows_of(finished_run) if not r.get("eval")] == [1, 2, 3, 4, 5]


def test_a_bad_row_in_the_middle_names_its_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(files.RunError, match=r"metrics.jsonl:2: not a metrics row"):
        metrics.read_metrics(str(path))


def test_the_resume_rewrite_of_a_long_metrics_file_holds_one_line_in_memory(tmp_path):
    import tracemalloc
    path = str(tmp_path / "metrics.jsonl")
    row = json.dumps({"step": 0, "reward": 0.5, "note": "x" * 200}) + "\n"
    with open(path, "w") as f:
        f.writelines(row.replace('"step": 0', f'"step": {step}') for step in range(10_000))  # ~2.3 MB
    tracemalloc.start()
    metrics.rewrite_metrics(path, (r for r in metrics.metrics_rows(path) if r["step"] <= 7_500))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20  # bytes: the file read whole would be 2.3 MB, a list of its rows ~10 MB of dicts
    assert sum(1 for _ in open(path)) == 7_501 and not os.path.exists(path + ".tmp")


def test_an_endless_last_line_is_skipped_in_chunks_not_read_whole(tmp_path, capsys):
    import tracemalloc
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n' + b"9" * (8 * metrics.MAX_METRICS_LINE))  # a kill mid-write of a huge row
    tracemalloc.start()
    rows = metrics.read_metrics(str(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rows == [{"step": 1}] and "dropped a half-written last row" in capsys.readouterr().out
    assert peak < 3 * metrics.MAX_METRICS_LINE


def test_a_metrics_file_that_is_a_device_or_fifo_is_one_line(tmp_path):
    (tmp_path / "metrics.jsonl").symlink_to("/dev/zero")
    with pytest.raises(files.RunError, match="metrics.jsonl is not a regular file"):
        metrics.read_metrics(str(tmp_path / "metrics.jsonl"))
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(files.RunError, match="fifo.jsonl is not a regular file"):
        metrics.read_metrics(str(tmp_path / "fifo.jsonl"))


def test_a_corrupt_line_met_during_the_resume_rewrite_leaves_the_file_and_no_tmp(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(files.RunError, match=r"metrics.jsonl:2"):
        metrics.rewrite_metrics(str(path), metrics.metrics_rows(str(path)))
    assert path.read_text() == '{"step": 1}\nnot json\n{"step": 2}\n' and not os.path.exists(f"{path}.tmp")


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_a_full_disk_or_read_only_folder_keeps_the_previous_latest(finished_run, capsys, monkeypatch, error):
    def fail(self, path, *args, **kwargs):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "model.safetensors"), "wb").write(b"half")
        raise OSError(error, os.strerror(error))
    monkeypatch.setattr(type(AutoModelForCausalLM.from_pretrained(os.path.join(finished_run, "latest"))),
                        "save_pretrained", fail)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", os.path.join(finished_run, "checkpoint-2"), "--save-every", "1"])
    err = one_line_error(capsys, exit_info)
    assert "could not write checkpoint" in err and os.strerror(error) in err
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-2")  # the run resumed
    assert not [name for name in os.listdir(finished_run) if name.endswith(".tmp")]


def test_keep_checkpoints_keeps_the_newest(tmp_path):
    run(tmp_path / "run", "--steps", "4", "--save-every", "1")  # default --keep-checkpoints 2
    assert checkpoint.checkpoint_steps(str(tmp_path / "run")) == [3, 4]


@pytest.mark.parametrize("victim", ["trainer_state.pt", "model.safetensors"])
def test_a_corrupt_checkpoint_file_is_one_line_naming_it(finished_run, capsys, victim):
    path = os.path.join(finished_run, "checkpoint-2", victim)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", os.path.join(finished_run, "checkpoint-2")])
    err = one_line_error(capsys, exit_info, code=exit_info.value.code)
    assert exit_info.value.code != 0 and ("checkpoint-2" in err)
    if victim == "trainer_state.pt":
        assert "truncated or corrupt" in err and "checkpoint-4" in err  # names a checkpoint to use instead


def test_a_missing_reference_policy_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    run(out, "--steps", "2", "--kl-coef", "0.01")
    [initial] = [name for name in os.listdir(out) if name.startswith("warm_start-")]
    os.rename(out / initial, tmp_path / "moved")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", str(out), "--steps", "3"])
    assert "reference (initial) policy" in one_line_error(capsys, exit_info)


def test_an_interrupted_warm_start_save_leaves_no_cache(tmp_path, monkeypatch, capsys):
    from harness import tiny as model_module

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(model_module.PreTrainedTokenizerFast, "save_pretrained", fail)
    with pytest.raises(SystemExit) as exit_info:
        run(tmp_path / "run", "--steps", "1", "--warm-start-steps", "2", "--task", "countdown")
    assert "No space left on device" in one_line_error(capsys, exit_info)
    assert not [name for name in os.listdir(tmp_path / "run") if name.startswith("warm_start-")]


# --- numbers ------------------------------------------------------------------------------------------------------
def test_an_empty_lopti_pass_takes_no_optimizer_step(tmp_path):
    # eta so small that no token has p_old < eta: the low pass is empty, so the run equals the one without Lopti.
    run(tmp_path / "off", "--steps", "2", "--alpha", "0.3", "--lopti-eta", "0")
    run(tmp_path / "tiny_eta", "--steps", "2", "--alpha", "0.3", "--lopti-eta", "1e-9")
    a, b = weights(tmp_path / "off" / "latest"), weights(tmp_path / "tiny_eta" / "latest")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["optimizer_steps"] for r in rows_of(tmp_path / "tiny_eta") if not r.get("eval")] == [1, 1]


def test_two_runs_saving_the_same_warm_start_keep_one_copy(tmp_path):
    # A seed sweep started at once: two runs compute the same warm start and both save it. The first complete copy
    # stays; the second run's save is dropped without an error (it was identical), and no temporary folder is left.
    from harness.tiny import build_char_tokenizer, build_tiny_model
    tokenizer = build_char_tokenizer()
    first, second = (build_tiny_model(tokenizer, hidden_size=32, num_layers=1, seed=seed) for seed in (0, 1))
    folder = str(tmp_path / "warm_start-x")
    manifest.save_policy_atomically(first, tokenizer, folder, {"steps": 1}, cache=True)
    manifest.save_policy_atomically(second, tokenizer, folder, {"steps": 2}, cache=True)
    assert json.load(open(os.path.join(folder, "warm_start.json"))) == {"steps": 1}
    assert os.listdir(tmp_path) == ["warm_start-x"]
    os.remove(os.path.join(folder, "warm_start.json"))  # an incomplete leftover is replaced
    manifest.save_policy_atomically(second, tokenizer, folder, {"steps": 2}, cache=True)
    assert json.load(open(os.path.join(folder, "warm_start.json"))) == {"steps": 2}
