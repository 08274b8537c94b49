"""A run's folder: one run at a time, never over another run, a kill's leftovers put right, writes only inside the
folder given, a refused resume that changes nothing. Every failure is one line naming the file, flag or process, with
the right exit code (2: a flag, 1: the run's files)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from harness import checkpoint, files
import train
from tests.run_cli import fails, finished_run, run  # noqa: F401 (finished_run: a fixture)
from tests.stubs import SMALL_TRAIN as SMALL


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("digits_task")


# --- 2. a second run never destroys the first ------------------------------------------------------------------------
def test_a_fresh_run_into_a_folder_holding_a_run_stops(finished_run, capsys):
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--task", "digits", "--output-dir", finished_run, *SMALL, "--steps", "2"])
    assert "holds a run" in err and "--resume" in err and "--overwrite" in err
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before
    assert checkpoint.checkpoint_steps(finished_run) == [2, 4]


def test_overwrite_starts_afresh_and_keeps_its_own_checkpoints(finished_run):
    run(finished_run, "--steps", "2", "--save-every", "1", "--overwrite")
    assert checkpoint.checkpoint_steps(finished_run) == [1, 2]  # the old 4 is gone, not kept over the new ones
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-2")
    assert [json.loads(line)["step"] for line in open(os.path.join(finished_run, "metrics.jsonl"))] == [0, 1, 2, 2]


def test_resuming_an_older_checkpoint_with_fewer_kept_never_prunes_what_it_writes(finished_run, capsys):
    train.main(["--resume", os.path.join(finished_run, "checkpoint-2"), "--keep-checkpoints", "1",
                "--save-every", "1", "--steps", "3"])
    out = capsys.readouterr().out
    assert "resumed from step 2" in out and "checkpoint-4 of this run will be replaced" in out
    assert checkpoint.checkpoint_steps(finished_run) == [3]  # 4 belonged to the replaced timeline
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-3")
    train.main(["--resume", finished_run, "--steps", "4"])  # and the run goes on from there
    assert checkpoint.checkpoint_steps(finished_run) == [4]


# --- 3. one run per folder -------------------------------------------------------------------------------------------
def hold_lock(folder):
    """Another process that takes the folder's lock as a run does (checkpoint.locked) and holds it: -> Popen."""
    code = (f"import sys, time; sys.path.insert(0, {REPO!r})\nfrom harness.checkpoint import locked\n"
            f"with locked({str(folder)!r}):\n    print('locked', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_run_in_the_same_folder_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = hold_lock(out)
    try:
        err = fails(capsys, ["--task", "digits", "--output-dir", str(out), *SMALL, "--steps", "1"])
        assert f"in use by process {holder.pid} on {socket.gethostname()}, started 20" in err
        assert not (out / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    run(out, "--steps", "1")  # its process is gone (killed: no clean-up of its own), so is its lock


def test_resuming_a_live_run_that_has_no_checkpoint_yet_names_it(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "eval": true}\n')
    holder = hold_lock(out)
    try:
        err = fails(capsys, ["--resume", str(out)])
        assert f"its run is still going (process {holder.pid} on" in err and "wait for its first checkpoint" in err
    finally:
        holder.kill()
        holder.wait()


def test_resuming_a_live_run_that_saves_every_step_names_it_before_torch_loads(tmp_path):
    # A live run prunes the checkpoint a resume has just chosen: "model path does not exist" (after torch loaded)
    # instead of the process that holds the folder. A real run, in another process, saving every step.
    out = str(tmp_path / "run")
    trainer = subprocess.Popen([sys.executable, "train.py", "--task", "countdown", "--output-dir", out, *SMALL,
                                "--steps", "10000", "--save-every", "1", "--keep-checkpoints", "1",
                                "--eval-every", "10000", "--idle-stop", "0"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code = ("import sys; from harness import flags\ntry:\n    flags.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    try:
        deadline = time.time() + 240
        while not checkpoint.checkpoint_steps(out) and time.time() < deadline:
            time.sleep(0.2)
        for target in [out, out, os.path.join(out, "latest"), out]:
            proc = subprocess.run([sys.executable, "-c", code, "--resume", target], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            assert proc.stdout.split() == ["False", "1"], proc.stderr
            assert f"is in use by process {trainer.pid} on" in proc.stderr and "still going" in proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    finally:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=120)
    assert trainer.returncode == 143  # it saved and stopped as always


def test_a_lock_file_nobody_holds_is_no_lock(tmp_path):
    # What a dead run leaves, even naming a live PID (a recycled one, or a process in another PID namespace):
    # only a held flock refuses, so such a file neither blocks forever nor lets a second run in.
    out = tmp_path / "run"
    out.mkdir()
    (out / checkpoint.LOCK).write_text(f"process {os.getppid()} on {socket.gethostname()}, started long ago\n")
    run(out, "--steps", "1")
    assert (out / "metrics.jsonl").exists()


def test_runs_entering_the_lock_at_the_same_instant_get_it_once(tmp_path):
    # 12 processes wait for the same instant, then all try the lock; whoever gets it holds it 2 s. Exactly one may
    # enter (the old O_EXCL-then-write-the-PID lock let a second one in, reading the empty file as stale).
    start_at = time.time() + 3.0
    code = (f"import sys, time; sys.path.insert(0, {REPO!r})\nfrom harness.checkpoint import locked\n"
            "from harness.files import RunError\n"
            f"time.sleep(max(0.0, {start_at} - time.time()))\n"
            f"try:\n    with locked({str(tmp_path)!r}):\n        print('entered', flush=True)\n"
            f"        time.sleep(2)\nexcept RunError as error:\n    print('refused', error)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(12)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert sum(out.startswith("entered") for out in outputs) == 1, outputs
    assert sum(out.startswith("refused") and "is in use by" in out for out in outputs) == 11, outputs


# --- 4. a full disk is one line, and leftovers of a kill are put right ----------------------------------------------
@pytest.mark.parametrize("error", ["safetensors", "torch"])
def test_a_save_that_raises_any_error_is_one_line_and_leaves_no_tmp(finished_run, capsys, monkeypatch, error):
    if error == "safetensors":
        from safetensors import SafetensorError

        def fail(self, path, *args, **kwargs):
            os.makedirs(path, exist_ok=True)
            raise SafetensorError("Error while serializing: IoError(No space left on device)")
        from transformers import PreTrainedModel
        monkeypatch.setattr(PreTrainedModel, "save_pretrained", fail)
    else:
        def fail(*args, **kwargs):
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1024 vs 512")
        monkeypatch.setattr(torch, "save", fail)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "could not write checkpoint" in err and "checkpoint-5" in err
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")
    assert not [name for name in os.listdir(finished_run) if name.endswith(".tmp")]


def test_leftovers_of_a_kill_are_cleaned_at_the_next_start(finished_run):
    half = os.path.join(finished_run, "checkpoint-6.tmp")  # a save killed half-way: its mark, no run.json yet
    os.makedirs(half)
    open(os.path.join(half, checkpoint.SAVE_MARK), "w").close()
    train.main(["--resume", finished_run, "--steps", "5"])
    assert not os.path.exists(half) and checkpoint.checkpoint_steps(finished_run) == [2, 4, 5]


def test_copies_a_user_made_beside_the_checkpoints_are_left_alone(finished_run, capsys):
    for name in ("checkpoint-2.old", "checkpoint-3.tmp", "checkpoint-4-best"):  # unmarked: not a save's leftovers
        os.system(f"cp -r {finished_run}/checkpoint-4 {finished_run}/{name}")
        os.remove(os.path.join(finished_run, name, checkpoint.SAVE_MARK))
    os.system(f"rm -r {finished_run}/checkpoint-2")  # the .old's name would once have restored it
    train.main(["--resume", finished_run, "--steps", "5"])
    assert {"checkpoint-2.old", "checkpoint-3.tmp", "checkpoint-4-best"} <= set(os.listdir(finished_run))
    assert checkpoint.checkpoint_steps(finished_run) == [4, 5] and "restored" not in capsys.readouterr().out
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-3.tmp"), "--steps", "6"])
    assert "must be named checkpoint-<step>" in err


def test_a_users_folder_in_the_way_of_a_save_stops_the_run_and_stays(finished_run, capsys):
    os.makedirs(os.path.join(finished_run, "checkpoint-5.tmp", "mine"))
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "checkpoint-5.tmp is in the way of this run's next save" in err
    assert os.path.isdir(os.path.join(finished_run, "checkpoint-5.tmp", "mine"))


# --- 5. a kill between the two renames of a save -------------------------------------------------------------------
def test_a_dangling_latest_falls_back_to_the_newest_complete_checkpoint(finished_run, capsys):
    # the window of a re-save of step 4: the old checkpoint-4 deleted, the new one still at .tmp, `latest` dangling
    os.system(f"cp -r {finished_run}/checkpoint-4 {finished_run}/checkpoint-4.tmp")
    os.system(f"rm -r {finished_run}/checkpoint-4")
    train.main(["--resume", finished_run, "--steps", "5"])
    out = capsys.readouterr().out
    assert "the newest complete one" in out and "resumed from step 4" in out
    assert checkpoint.checkpoint_steps(finished_run) == [2, 4, 5]
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-5")


def test_a_run_copied_with_its_links_followed_resumes_as_the_original(finished_run, tmp_path, capsys):
    import shutil
    copy = str(tmp_path / "copy")
    shutil.copytree(finished_run, copy, symlinks=False)  # cp -rL, scp -r: `latest` becomes a folder
    assert os.path.isdir(os.path.join(copy, "latest")) and not os.path.islink(os.path.join(copy, "latest"))
    train.main(["--resume", copy, "--steps", "5"])
    assert "resuming from checkpoint-4, its twin" in capsys.readouterr().out
    assert os.path.realpath(os.path.join(copy, "latest")) == os.path.join(os.path.realpath(copy), "checkpoint-5")
    train.main(["--resume", finished_run, "--steps", "5"])
    timing = ("rollout_s", "update_s", "tokens_per_s")
    rows = [[{k: v for k, v in json.loads(line).items() if k not in timing} for line in open(f"{run}/metrics.jsonl")]
            for run in (finished_run, copy)]
    assert rows[0] == rows[1]
    other = str(tmp_path / "other")
    shutil.copytree(finished_run, other, symlinks=False)
    torch.save({"not": "a twin"}, os.path.join(other, "latest", "trainer_state.pt"))
    assert "copies none of its checkpoint-<step> folders" in fails(capsys, ["--resume", other, "--steps", "6"])


def test_resuming_a_finished_run_says_there_is_nothing_to_do(finished_run, capsys):
    train.main(["--resume", finished_run, "--steps", "3"])
    assert "--steps 3 is reached: nothing to train" in capsys.readouterr().out


def test_resuming_an_older_checkpoint_with_nothing_to_train_changes_nothing(finished_run, capsys):
    # --resume RUN/checkpoint-2 --steps 2 used to say "nothing to train" and delete the metrics of steps 3-4, whose
    # checkpoint still exists, and point `latest` back at checkpoint-2.
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    train.main(["--resume", os.path.join(finished_run, "checkpoint-2"), "--steps", "2"])
    assert "nothing to train" in capsys.readouterr().out
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")


def test_a_refused_resume_leaves_latest_and_the_metrics_alone(finished_run, capsys):
    path = os.path.join(finished_run, "checkpoint-2", checkpoint.TRAINER_STATE)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "optimizer": {"state": {}, "param_groups": []}}, path)  # fits no model
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-2"), "--steps", "6"])
    assert "optimizer state does not fit" in err
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")


def test_an_optimizer_state_of_the_wrong_shapes_is_one_line(finished_run, capsys):
    # load_state_dict accepts it (same parameter count); the first optimizer step would then fail in a traceback
    path = os.path.join(finished_run, "checkpoint-4", checkpoint.TRAINER_STATE)
    state = torch.load(path, weights_only=True)
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"] = first["exp_avg"].reshape(-1)[:3].clone()
    torch.save(state, path)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "optimizer state does not fit this model" in err


@pytest.mark.parametrize("key, value", [("maximize", True), ("weight_decay", 0.5), ("betas", [0.5, 0.5]),
                                        ("eps", 1e-3), ("amsgrad", True)])
def test_an_optimizer_setting_in_the_checkpoint_never_overrides_the_runs(finished_run, capsys, key, value):
    # load_state_dict takes the file's param_groups: `maximize: true` trained by gradient ascent, with exit code 0
    path = os.path.join(finished_run, "checkpoint-4", checkpoint.TRAINER_STATE)
    state = torch.load(path, weights_only=True)
    state["optimizer"]["param_groups"][0][key] = value
    torch.save(state, path)
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert f"its optimizer's {key} is {value!r}" in err and "run.json" in err
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before


def test_a_resume_whose_loggers_fail_has_changed_nothing(finished_run, capsys, monkeypatch):
    # Resuming checkpoint-2 of a 4-step run drops the rows of steps 3-4 and moves `latest`; a logger that fails to
    # open (a W&B run id it refuses, a full disk under tensorboard/) used to do so after those changes.
    from harness import report

    def refuse(*args, **kwargs):
        raise files.RunError("the logger refused")
    monkeypatch.setattr(report, "open_reporters", refuse)
    before = sorted(os.listdir(finished_run)), open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-2"), "--steps", "6"])
    assert "the logger refused" in err
    assert (sorted(os.listdir(finished_run)), open(os.path.join(finished_run, "metrics.jsonl")).read()) == before
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")


# --- 10. writes stay inside the folder given -------------------------------------------------------------------------
def test_a_latest_pointing_into_another_folder_is_refused(finished_run, tmp_path, capsys):
    other = tmp_path / "other"
    run(other, "--steps", "2")
    latest = os.path.join(finished_run, "latest")
    os.remove(latest)
    os.symlink(os.path.join(other, "checkpoint-2"), latest)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "points outside its run folder" in err
    assert checkpoint.checkpoint_steps(str(other)) == [2] and not os.path.exists(other / "checkpoint-5")


def test_a_checkpoint_linked_in_from_another_run_is_refused(finished_run, tmp_path, capsys):
    # --resume RUN/checkpoint-6 where that folder is a link into another run's folder: the run would continue there
    other = tmp_path / "other"
    run(other, "--steps", "6", "--save-every", "6")
    os.symlink(os.path.join(other, "checkpoint-6"), os.path.join(finished_run, "checkpoint-6"))
    before = sorted(os.listdir(other)), open(other / "metrics.jsonl").read()
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-6"), "--steps", "8"])
    assert "outside the folder it stands in" in err
    assert (sorted(os.listdir(other)), open(other / "metrics.jsonl").read()) == before


def test_overwrite_also_deletes_the_old_runs_picture(finished_run):
    (open(os.path.join(finished_run, "metrics.png"), "wb")).write(b"\x89PNG old")
    run(finished_run, "--steps", "1", "--overwrite")
    assert not os.path.exists(os.path.join(finished_run, "metrics.png"))


def test_a_stopped_run_is_told_to_resume_only_when_it_has_a_checkpoint(tmp_path):
    """A write that fails before the first checkpoint (a logger's full disk at step 1) cannot be resumed: the line
    says to run the command again; once a checkpoint exists it says --resume."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert checkpoint.then_resume(str(tmp_path)) == ", then run the command again (no checkpoint saved yet)"
    with pytest.raises(files.RunError, match="no checkpoint saved yet"):
        from harness.metrics import append_metrics
        append_metrics(str(tmp_path / "no-such-folder" / "metrics.jsonl"), {"step": 2})
    (tmp_path / "checkpoint-2").mkdir()
    os.symlink("checkpoint-2", tmp_path / "latest")
    assert checkpoint.then_resume(str(tmp_path)) == ", then continue with --resume"


@pytest.mark.parametrize("free, said", [(0, "disk full (0 bytes free); free some disk space"),
                                        (10**12, "[enforce fail at inline_container.cc:672]")])
def test_a_full_disk_inside_torch_save_is_said_so(tmp_path, monkeypatch, free, said):
    # it read "[enforce fail at inline_container.cc:672] . unexpected pos 960 vs 832"; with room left on the disk the
    # writer's own words stay (not a full disk: maybe a bug)
    import collections
    import shutil

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 960 vs 832")
    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(torch, "save", full)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1, 1, free))
    monkeypatch.setattr(checkpoint, "save_policy", lambda model, folder: None)
    tokenizer = type("Tokenizer", (), {"save_pretrained": lambda self, folder: None})()
    with pytest.raises(files.RunError) as error:
        checkpoint.save_checkpoint(str(tmp_path), 1, model, tokenizer, {}, {})
    assert f"could not write checkpoint {tmp_path}/checkpoint-1: {said}" in str(error.value)
    assert os.listdir(tmp_path) == []
