"""A run always resumes after a kill at any point of its save, and every file a resume or merge reads is the one its
save wrote (issue 69, items 2 and 4): leftovers of the run's own temporary names are put right, never refused as
planted; a checkpoint's files are checked as one set (manifest.json), the warm-start cache like a checkpoint, and
merge_lora's base against the one the run recorded. Each refusal is one line, and nothing is lost."""
import contextlib
import glob
import json
import os
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import train
from harness import checkpoint, manifest as manifest_module
from harness.files import RunError
from harness import checkpoint as checkpoint_module, run as run_module, settle
from tests.run_cli import fails, run
from tests.stubs import SMALL_TRAIN as SMALL

pytestmark = pytest.mark.usefixtures("digits_task")


def weights(folder):
    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def rows(out):
    return [{k: v for k, v in json.loads(line).items() if k not in run_module.TIMING_KEYS}
            for line in open(os.path.join(out, "metrics.jsonl"))]


# --- a kill at any point of the save ---------------------------------------------------------------------------------
class Killed(BaseException):
    """A SIGKILL at this call: nothing after it runs, and no `except Exception` sees it."""


FILE_CALLS = [(os, "replace"), (os, "rename"), (os, "symlink"), (os, "mkdir"), (os, "makedirs"), (os, "remove"),
              (os, "unlink"), (os, "rmdir"), (shutil, "rmtree")]  # each call: a point where a kill may fall


def kill_save(monkeypatch, step, at):
    """During the save at `step`, the at-th call of FILE_CALLS (from 1) raises Killed. -> the names of the calls
    made up to it, in order (all of the save's calls when `at` is past them)."""
    calls, save = [], checkpoint_module.save_checkpoint

    def wrapped(*args, **kwargs):
        if args[1] != step:
            return save(*args, **kwargs)
        with contextlib.ExitStack() as undo:
            for module, name in FILE_CALLS:
                original = getattr(module, name)

                def call(*a, __original=original, __name=name, **k):
                    calls.append(__name)
                    if len(calls) == at:
                        raise Killed(f"{__name} {a[:2]}")
                    return __original(*a, **k)
                setattr(module, name, call)
                undo.callback(setattr, module, name, original)
            return save(*args, **kwargs)
    monkeypatch.setattr(run_module, "save_checkpoint", wrapped)
    return calls


@pytest.fixture(scope="module")
def saved_at_2(tmp_path_factory):
    """A run saved at step 2 (one checkpoint kept), and what resuming it to step 4 gives: (folder, final weights,
    metrics rows, the save's calls at step 4)."""
    mp = pytest.MonkeyPatch()
    import tasks
    from tests.stubs import DigitsTask
    mp.setitem(tasks.TASKS, "digits", lambda data=None: DigitsTask())
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("kill") / "base"
    run(base, "--steps", "2", "--save-every", "2", "--keep-checkpoints", "1")
    whole = base.parent / "whole"
    shutil.copytree(base, whole, symlinks=True)
    calls = kill_save(mp, 4, at=0)
    train.main(["--resume", str(whole), "--steps", "4"])
    mp.undo()
    yield base, weights(whole / "latest"), rows(whole), list(calls)


def resumes_after_a_kill(saved_at_2, monkeypatch, tmp_path, at):
    """Resume the run saved at step 2 to step 4, killed at the at-th file call of the save at step 4; then
    `--resume` alone: the same final weights and metrics rows as the run never killed, and no leftover."""
    base, final, whole_rows, _ = saved_at_2
    out = tmp_path / f"killed-{at}"
    shutil.copytree(base, out, symlinks=True)
    kill_save(monkeypatch, 4, at)
    with pytest.raises(Killed):
        train.main(["--resume", str(out), "--steps", "4"])
    monkeypatch.setattr(run_module, "save_checkpoint", checkpoint.save_checkpoint)
    train.main(["--resume", str(out), "--steps", "4"])  # f80a5bd: a latest.tmp link left was refused as planted
    resumed = weights(out / "latest")
    assert resumed.keys() == final.keys() and all(torch.equal(resumed[k], final[k]) for k in final)
    assert rows(out) == whole_rows
    assert os.path.realpath(out / "latest") == str(out / "checkpoint-4")
    assert not [name for name in os.listdir(out) if name.endswith((".tmp", ".pruning"))]


RENAMES = ("replace", "rename", "symlink", "mkdir")  # the calls after which the folder is in a new state


def test_a_run_resumes_after_a_kill_at_each_rename_of_its_save(saved_at_2, monkeypatch, tmp_path):
    calls = saved_at_2[3]
    points = [at for at, name in enumerate(calls, 1) if name in RENAMES]
    assert calls.count("symlink") == 1 and len(points) >= 5, calls  # latest.tmp; the .tmp folder, its rename, ...
    for at in points:
        resumes_after_a_kill(saved_at_2, monkeypatch, tmp_path, at)


@pytest.mark.slow
def test_a_run_resumes_after_a_kill_at_each_file_call_of_its_save(saved_at_2, monkeypatch, tmp_path):
    for at in range(1, len(saved_at_2[3]) + 1):
        resumes_after_a_kill(saved_at_2, monkeypatch, tmp_path, at)


def test_a_latest_tmp_that_is_no_link_of_the_run_is_still_refused(tmp_path, capsys):
    out = tmp_path / "run"
    run(out, "--steps", "2", "--save-every", "2")
    os.symlink(str(tmp_path), out / "latest.tmp")  # not checkpoint-<step>: planted, never followed nor removed
    assert "latest.tmp is a link" in fails(capsys, ["--resume", str(out), "--steps", "3"])
    os.remove(out / "latest.tmp")
    (out / "latest.tmp").mkdir()  # a folder: not the run's either
    assert "latest.tmp is a directory" in fails(capsys, ["--resume", str(out), "--steps", "3"])
    assert os.path.isdir(out / "latest.tmp")


def test_an_empty_checkpoint_tmp_folder_is_removed_and_the_save_goes_on(tmp_path):
    # a kill between the save's mkdir and its mark left an empty checkpoint-4.tmp: f80a5bd refused the save at 4
    out = tmp_path / "run"
    run(out, "--steps", "2", "--save-every", "2")
    (out / "checkpoint-4.tmp").mkdir()
    train.main(["--resume", str(out), "--steps", "4"])
    assert checkpoint.checkpoint_steps(str(out))[-1] == 4 and not os.path.exists(out / "checkpoint-4.tmp")


def test_a_failed_prune_is_said_when_it_fails(tmp_path, capsys, monkeypatch):
    # f80a5bd: the deletion failed silently; the next start said so
    rmtree = shutil.rmtree

    def denied(path, *args, ignore_errors=False, **kwargs):
        if str(path).endswith(checkpoint.PRUNING):
            if ignore_errors:
                return None
            raise PermissionError(13, "Permission denied", str(path))
        return rmtree(path, *args, ignore_errors=ignore_errors, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", denied)
    run(tmp_path / "run", "--steps", "2", "--save-every", "1", "--keep-checkpoints", "1")
    out = capsys.readouterr().out
    assert f"note: could not delete {tmp_path / 'run' / 'checkpoint-1.pruning'} (Permission denied)" in out


def test_a_warm_start_copy_a_killed_process_left_is_removed(tmp_path):
    # a kill inside save_policy_atomically left <cache>.tmp-<PID> (7 MB for the tiny default) for good
    import subprocess
    import sys
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    flags = ["--task", "digits", *SMALL, "--warm-start-steps", "2", "--warm-start-cache", str(tmp_path / "cache"),
             "--steps", "1"]
    from harness import flags as flags_module, tiny
    folder = tiny.initial_policy_dir(settle.settle(flags_module.parse_args([*flags, "--output-dir",
                                                                          str(tmp_path / "a")]))[0])
    os.makedirs(f"{folder}.tmp-{dead.pid}")
    open(f"{folder}.tmp-{dead.pid}/model.safetensors", "wb").write(b"half")
    os.makedirs(f"{folder}.tmp-{os.getppid()}")  # a live process's: not ours to delete
    train.main([*flags, "--output-dir", str(tmp_path / "a")])
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([os.path.basename(folder),
                                                             f"{os.path.basename(folder)}.tmp-{os.getppid()}"])


# --- a checkpoint's files, one set ---------------------------------------------------------------------------------
@pytest.fixture
def saved_run(tmp_path):
    out = tmp_path / "run"
    run(out, "--steps", "2", "--save-every", "2")
    return out


@pytest.mark.parametrize("name, change", [
    ("config.json", lambda s: {**s, "rms_norm_eps": 0.5}),  # loads, and silently computes another model
    ("tokenizer_config.json", lambda s: {**s, "model_max_length": 7}),
    ("run.json", lambda s: {**s, "eval_every": 3})])
def test_a_changed_file_of_a_checkpoint_is_refused_at_resume(saved_run, capsys, name, change):
    # f80a5bd checked the weights' sha256 only: each of these resumed, exit 0
    path = saved_run / "checkpoint-2" / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    before = (saved_run / "metrics.jsonl").read_text()
    err = fails(capsys, ["--resume", str(saved_run), "--steps", "3"])
    assert f"{path}: not the file its save wrote (its sha256 differs from the one in manifest.json" in err
    assert (saved_run / "metrics.jsonl").read_text() == before


def test_weights_and_state_copied_whole_from_another_run_are_refused(saved_run, tmp_path, capsys):
    # the pair agrees with itself (the state holds the weights' sha256), so f80a5bd resumed it: another run's weights
    other = tmp_path / "other"
    run(other, "--steps", "2", "--save-every", "2", "--seed", "1")
    for name in ("model.safetensors", checkpoint.TRAINER_STATE):
        shutil.copy(other / "checkpoint-2" / name, saved_run / "checkpoint-2" / name)
    err = fails(capsys, ["--resume", str(saved_run), "--steps", "3"])
    assert f"{saved_run / 'checkpoint-2' / 'model.safetensors'}: not the file its save wrote" in err


def test_a_file_the_save_did_not_write_is_refused(saved_run, capsys):
    (saved_run / "checkpoint-2" / "chat_template.jinja").write_text("{{ 'x' }}")  # the tokenizer would take it
    err = fails(capsys, ["--resume", str(saved_run), "--steps", "3"])
    assert "chat_template.jinja: a file its save did not write (not in manifest.json)" in err


def test_a_checkpoint_from_before_the_manifest_resumes_with_a_note(saved_run, capsys):
    os.remove(saved_run / "checkpoint-2" / manifest_module.MANIFEST)  # and its trainer_state.pt's word of it:
    state = saved_run / "checkpoint-2" / checkpoint.TRAINER_STATE  # a save from before manifests
    torch.save({k: v for k, v in torch.load(state, weights_only=True).items() if k != manifest_module.MANIFEST}, state)
    train.main(["--resume", str(saved_run), "--steps", "3"])
    notes = [line for line in capsys.readouterr().out.splitlines() if "listed their files' sha256" in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: {saved_run / 'checkpoint-2'} was saved before")
    assert checkpoint.checkpoint_steps(str(saved_run))[-1] == 3
    assert os.path.exists(saved_run / "checkpoint-3" / manifest_module.MANIFEST)  # the next one has it


def test_a_deleted_manifest_of_a_save_that_wrote_one_is_refused(saved_run, capsys):
    # 2c9f269: with manifest.json deleted, an edited config.json resumed with a note and trained a broken model
    os.remove(saved_run / "checkpoint-2" / manifest_module.MANIFEST)
    path = saved_run / "checkpoint-2" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rms_norm_eps": 1e30}))
    err = fails(capsys, ["--resume", str(saved_run), "--steps", "3"])
    assert f"{saved_run / 'checkpoint-2' / 'manifest.json'}: missing, though its save wrote one" in err
    assert checkpoint.checkpoint_steps(str(saved_run)) == [2]


def test_the_note_of_the_checkpoint_a_resume_takes_follows_its_checks(saved_run, capsys):
    # 2c9f269 said "resuming from checkpoint-2" and then refused checkpoint-2: the refusal alone now
    os.remove(saved_run / "latest")
    path = saved_run / "checkpoint-2" / "config.json"
    good = path.read_text()
    path.write_text(json.dumps({**json.loads(good), "rms_norm_eps": 0.5}))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train.main(["--resume", str(saved_run), "--steps", "3"])
    said = capsys.readouterr()
    assert "config.json: not the file its save wrote" in said.err and "resuming from" not in said.out + said.err
    path.write_text(good)
    train.main(["--resume", str(saved_run), "--steps", "3"])
    out = capsys.readouterr().out
    assert out.count("resuming from checkpoint-2, the newest complete one") == 1
    assert out.index("resuming from checkpoint-2") < out.index("resumed from step 2")


def listing(folder, name, digest):
    """folder's manifest with one more entry, `name`: `digest`."""
    path = os.path.join(folder, manifest_module.MANIFEST)
    table = json.load(open(path))
    json.dump({"sha256": {**table["sha256"], name: digest}}, open(path, "w"))


@pytest.mark.parametrize("name", ["../metrics.jsonl", "ABSOLUTE", ".."])
def test_a_manifest_names_only_files_of_its_own_folder(saved_run, capsys, name):
    # 2c9f269 hashed whatever a manifest listed: a file outside the folder, listed with its right digest, passed as
    # one of the checkpoint's (exit 0), and /proc/self/pagemap hung the resume (the next test)
    outside = saved_run / "metrics.jsonl"
    name = str(outside) if name == "ABSOLUTE" else name
    listing(saved_run / "checkpoint-2", name, manifest_module.file_sha256(outside))
    err = fails(capsys, ["--resume", str(saved_run), "--steps", "3"])
    assert f"manifest.json lists {name!r}, which is no file name of its folder" in err


def test_a_listed_proc_file_is_refused_unread_in_a_checkpoint_and_a_warm_start_cache(saved_run, tmp_path):
    flags, cache = cached_warm_start(tmp_path)
    for folder in (str(saved_run / "checkpoint-2"), cache):  # merge_lora verifies a checkpoint the same way
        listing(folder, "/proc/self/pagemap", "0" * 64)
        signal.signal(signal.SIGALRM, lambda *_: pytest.fail("still hashing after 20 s"))
        signal.alarm(20)  # 2c9f269 read the file's 2**55 bytes: the alarm ends that here, failing
        try:
            with pytest.raises(RunError, match="lists '/proc/self/pagemap', which is no file name of its folder"):
                manifest_module.verify_manifest(folder, "hint")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)


def test_a_digest_table_that_is_not_one_is_one_line(saved_run, capsys):
    # f80a5bd: a string weights_sha256 in trainer_state.pt was an AttributeError traceback
    path = saved_run / "checkpoint-2" / checkpoint.TRAINER_STATE
    torch.save({**torch.load(path, weights_only=True), checkpoint.WEIGHTS_SHA256: "0" * 64}, path)
    err = fails(capsys, ["--resume", str(saved_run), "--steps", "3"])
    assert "its 'weights_sha256' is not a table of file names to sha256 digests" in err


def test_a_refusal_names_its_checkpoint_once(saved_run, capsys):
    # f80a5bd: "train.py: error: .../checkpoint-2: .../checkpoint-2: config.json is not readable JSON ..."
    (saved_run / "checkpoint-2" / "config.json").write_text("[[[")
    err = fails(capsys, ["--resume", str(saved_run), "--steps", "3"])
    assert err.count(str(saved_run / "checkpoint-2")) == 1 and "config.json is not readable JSON" in err


# --- the warm-start cache, checked like a checkpoint -----------------------------------------------------------------
def cached_warm_start(tmp_path):
    """-> (the flags of a tiny run whose warm start is cached, the cache folder), the cache written."""
    flags = ["--task", "digits", *SMALL, "--warm-start-steps", "2", "--warm-start-cache", str(tmp_path / "cache"),
             "--steps", "1"]
    train.main([*flags, "--output-dir", str(tmp_path / "a")])
    [folder] = glob.glob(str(tmp_path / "cache" / "warm_start-*"))
    return flags, folder


def rewrite_weights(folder, change):
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    save_file(change(tensors), path, metadata={"format": "pt"})


@pytest.mark.parametrize("damage, message", [
    (lambda t: {k: v for k, v in t.items() if "mlp.down_proj" not in k}, "the warm start lacks the weight "
     "'model.layers.0.mlp.down_proj.weight'"),  # f80a5bd: drawn at random, exit 0
    (lambda t: {k: v.fill_(float("nan")) if "mlp.down_proj" in k else v for k, v in t.items()},
     "the warm start's weight 'model.layers.0.mlp.down_proj.weight' is not finite"),  # f80a5bd: a traceback
    (lambda t: {k: v + 0.01 if "mlp.down_proj" in k else v for k, v in t.items()},
     "model.safetensors: not the file its save wrote (its sha256 differs from the one in manifest.json")])
def test_a_damaged_warm_start_cache_is_one_line(tmp_path, capsys, damage, message):
    flags, folder = cached_warm_start(tmp_path)
    rewrite_weights(folder, damage)
    err = fails(capsys, [*flags, "--output-dir", str(tmp_path / "b")])
    assert message in err and folder in err and "delete that warm-start folder" in err
    assert not os.path.exists(tmp_path / "b" / "metrics.jsonl")


def test_a_warm_start_cache_from_before_its_digests_loads_with_a_note(tmp_path, capsys):
    flags, folder = cached_warm_start(tmp_path)
    manifest = os.path.join(folder, manifest_module.MANIFEST)
    assert set(json.load(open(manifest))["sha256"]) == set(os.listdir(folder)) - {manifest_module.MANIFEST}
    capsys.readouterr()
    train.main([*flags, "--output-dir", str(tmp_path / "checked")])  # its files as saved: loaded, no note
    assert "warm start: loaded" in capsys.readouterr().out
    os.remove(manifest)
    capsys.readouterr()
    train.main([*flags, "--output-dir", str(tmp_path / "b")])
    assert f"note: {folder} was cached before warm starts listed their files' sha256" in capsys.readouterr().out


# --- merge_lora's base, as the run recorded it -----------------------------------------------------------------------
def test_merge_lora_refuses_a_changed_base(tmp_path, capsys):
    pytest.importorskip("peft")
    from harness.flags import saved_config
    from harness.merge_lora import main as export
    out = tmp_path / "run"
    run(out, "--steps", "1", "--lora-rank", "4")
    settings = saved_config(str(out / "checkpoint-1"))
    assert settings.initial_policy_sha256 is not None
    rewrite_weights(settings.initial_policy, lambda t: {k: v * 1.01 for k, v in t.items()})  # another base
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        export([str(out / "latest"), str(tmp_path / "merged")])  # f80a5bd: merged into it, exit 0
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and len(err.splitlines()) == 1 and not os.path.exists(tmp_path / "merged")
    assert err.startswith(f"merge_lora: error: {settings.initial_policy}: not the base this LoRA run trained on")
    assert "--resume" not in err
    err = fails(capsys, ["--resume", str(out), "--steps", "2"])  # a resume loads that base too
    assert "not the base this LoRA run trained on" in err


def test_a_base_in_run_json_is_read_only_once_its_manifest_vouches_and_never_from_proc(tmp_path, capsys):
    # 381f0cf hashed run.json's initial_policy before checking the manifest: /proc/self/pagemap hung both
    pytest.importorskip("peft")
    from harness.merge_lora import main as export
    out = tmp_path / "run"
    run(out, "--steps", "1", "--lora-rank", "2")
    path = out / "checkpoint-1" / checkpoint.RUN_SETTINGS
    path.write_text(json.dumps({**json.loads(path.read_text()), "initial_policy": "/proc/self/pagemap"}))
    for vouched in (False, True):  # the manifest untouched; then rewritten to match
        message = "/proc/self/pagemap is a file of /proc or /sys" if vouched else \
            f"{path}: not the file its save wrote (its sha256 differs from the one in manifest.json"
        with pytest.raises(SystemExit):
            export([str(out / "latest"), str(tmp_path / "merged")])
        assert message in capsys.readouterr().err
        assert message in fails(capsys, ["--resume", str(out), "--steps", "2"])
        listing(out / "checkpoint-1", checkpoint.RUN_SETTINGS, manifest_module.file_sha256(path))
