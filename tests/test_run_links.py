"""A run writes only inside its folder: a link planted there, to a file or folder outside, is refused in one line and
what it points to is left as it was, byte for byte. Every link here points into the test's own tmp folder."""
import os

import pytest

from harness import checkpoint, metrics
import train
from tests.stubs import SMALL_TRAIN as SMALL

pytestmark = pytest.mark.usefixtures("digits_task")


def run(out, *extra):
    return train.main(["--task", "digits", "--output-dir", str(out), *SMALL, *extra])


def one_line(capsys, argv, code=1, prog="train.py"):
    with pytest.raises(SystemExit) as exit_info:
        (train.main if prog == "train.py" else prog)(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert exit_info.value.code == code and "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def snapshot(path):
    """Everything under path (a file or a folder): names and bytes, to compare before and after."""
    if os.path.isfile(path):
        return open(path, "rb").read()
    return sorted((os.path.relpath(os.path.join(root, name), path), open(os.path.join(root, name), "rb").read())
                  for root, _, names in os.walk(path) for name in names)


@pytest.fixture
def outside(tmp_path):
    """A file and a folder outside the run folder that a link will point at."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "thesis.txt").write_text("years of work\n")
    (tmp_path / "outside" / "step-3.html").write_text("my page\n")
    return tmp_path / "outside"


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A 2-step run with checkpoints 1 and 2, copied fresh into each test that resumes it."""
    import tasks
    from tests.stubs import DigitsTask
    out = tmp_path_factory.mktemp("links") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(tasks.TASKS, "digits", lambda data=None: DigitsTask())
        run(out, "--steps", "2", "--save-every", "1", "--keep-checkpoints", "0")
    return out


@pytest.fixture
def finished(saved_run, tmp_path):
    import shutil
    copy = tmp_path / "run"
    shutil.copytree(saved_run, copy, symlinks=True)
    return copy


# name in the run folder -> does the link point at a file (False: a folder)
OWNED = {".lock": True, "metrics.jsonl.tmp": True, "unsaved-metrics.jsonl": True, "latest.tmp": True,
         "inspect": False, "tensorboard": False, "wandb": False, "checkpoint-3": False, "checkpoint-3.tmp": False,
         "checkpoint-1.pruning": False}


@pytest.mark.parametrize("name", sorted(OWNED))
def test_a_link_the_run_would_write_through_is_refused_on_resume(finished, outside, capsys, name):
    """Resuming past the link's step: one line naming the link, the target unchanged, the link still there."""
    target = outside / "thesis.txt" if OWNED[name] else outside
    before = snapshot(target)
    if os.path.lexists(finished / name):
        os.remove(finished / name)  # the run's own .lock
    (finished / name).symlink_to(target)
    if name == "checkpoint-1.pruning":
        (outside / checkpoint.SAVE_MARK).write_text("")  # looks like a save's own folder, through the link
        before = snapshot(target)
    error = one_line(capsys, ["--resume", str(finished), "--steps", "4", "--inspect-every", "3"])
    assert f"{finished / name} is a link" in error
    assert snapshot(target) == before and os.path.islink(finished / name)


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl.tmp", "inspect", "warm_start-digits-h1-l1-0"])
def test_a_link_planted_in_an_empty_folder_is_refused_before_a_fresh_run(tmp_path, outside, capsys, name):
    target = outside / "thesis.txt" if OWNED.get(name, False) else outside
    before = snapshot(target)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).symlink_to(target)
    assert f"is a link" in one_line(capsys, ["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL])
    assert snapshot(target) == before


def test_the_warm_start_cache_is_never_read_or_written_through_a_link(tmp_path, outside, capsys):
    """The tiny model's cache folder, as its settings name it, planted as a link: refused, nothing written there."""
    from harness import config, tiny
    settings = config.load(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL])
    folder = tiny.initial_policy_dir(settings)
    os.makedirs(os.path.dirname(folder))
    os.symlink(outside, folder)
    before = snapshot(outside)
    assert f"{folder} is a link" in one_line(capsys, ["--task", "digits", "--output-dir", str(tmp_path / "run"),
                                                      *SMALL])
    assert snapshot(outside) == before


def test_a_metrics_file_that_is_a_link_is_refused_on_resume(finished, outside, capsys):
    target = outside / "thesis.txt"
    target.write_bytes((finished / "metrics.jsonl").read_bytes())  # rows a resume would adopt and rewrite
    before = snapshot(target)
    os.remove(finished / "metrics.jsonl")
    (finished / "metrics.jsonl").symlink_to(target)
    assert "metrics.jsonl is a link" in one_line(capsys, ["--resume", str(finished), "--steps", "3"])
    assert snapshot(target) == before


def test_the_metrics_writers_never_follow_a_link(tmp_path, outside):
    """append_metrics and rewrite_metrics meet a link planted after the run's start: a RunError, the target intact."""
    target, path = outside / "thesis.txt", tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    (tmp_path / "metrics.jsonl.tmp").symlink_to(target)
    with pytest.raises(checkpoint.RunError, match="metrics.jsonl.tmp is a link"):
        metrics.rewrite_metrics(str(path), metrics.read_metrics(str(path)))
    assert target.read_text() == "years of work\n" and path.read_text() == '{"step": 1}\n'
    (tmp_path / "other.jsonl").symlink_to(target)
    with pytest.raises(checkpoint.RunError, match="other.jsonl is a link"):
        metrics.append_metrics(str(tmp_path / "other.jsonl"), {"step": 2})
    assert target.read_text() == "years of work\n"


def test_the_step_page_is_never_written_through_a_linked_inspect_folder(finished, outside, capsys):
    """experiments.inspect_step on a checkpoint whose run folder holds a linked inspect/: refused, the page there
    (a user's step-3.html) unchanged."""
    from experiments import inspect_step
    (finished / "inspect").symlink_to(outside)
    before = snapshot(outside)
    error = one_line(capsys, [str(finished / "checkpoint-2")], prog=inspect_step.main)
    assert "inspect is a link" in error and snapshot(outside) == before


def test_the_picture_replaces_a_link_beside_the_metrics_never_its_target(finished, outside):
    from experiments import plot_metrics
    (finished / "metrics.png").symlink_to(outside / "thesis.txt")
    plot_metrics.main([str(finished)])
    assert (outside / "thesis.txt").read_text() == "years of work\n"
    assert not os.path.islink(finished / "metrics.png")
    assert (finished / "metrics.png").read_bytes().startswith(b"\x89PNG")


def test_a_latest_that_links_out_is_refused_and_one_to_a_checkpoint_beside_it_is_not(finished):
    checkpoint.refuse_planted_links(str(finished))  # `latest -> checkpoint-2`: the save's own link
    os.remove(finished / "latest")
    (finished / "latest").symlink_to(finished.parent)
    with pytest.raises(checkpoint.RunError, match="latest is a link"):
        checkpoint.refuse_planted_links(str(finished))


# --- a prune that a kill interrupted leaves nothing that later saves cannot remove --------------------------------
def half_deleted(folder):
    """What a kill during shutil.rmtree leaves: the save's mark and some files, not run.json."""
    for name in (checkpoint.RUN_SETTINGS, checkpoint.TRAINER_STATE):
        os.remove(folder / name)


def test_a_prune_renames_first_so_a_kill_leaves_a_pruning_folder_the_next_start_removes(finished, capsys,
                                                                                       monkeypatch):
    import shutil
    real_rmtree = shutil.rmtree

    def killed_midway(path, *args, **kwargs):
        if str(path).endswith(checkpoint.PRUNING):
            raise KeyboardInterrupt  # the kill, before anything was deleted
        return real_rmtree(path, *args, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(str(finished / "checkpoint-1"))
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert not os.path.exists(finished / "checkpoint-1") and os.path.isdir(finished / "checkpoint-1.pruning")
    checkpoint.recover(str(finished), log=lambda message: None)
    assert not os.path.exists(finished / "checkpoint-1.pruning") and checkpoint.checkpoint_steps(str(finished)) == [2]


def test_a_half_deleted_checkpoint_is_removed_and_a_resume_from_it_names_a_complete_one(finished, capsys):
    half_deleted(finished / "checkpoint-1")  # as a prune before the rename-first rule could leave it
    error = one_line(capsys, ["--resume", str(finished / "checkpoint-1"), "--steps", "3"])
    assert "resume from checkpoint-2" in error and "start the run again" not in error
    run(finished, "--resume", str(finished), "--steps", "3", "--keep-checkpoints", "2")
    assert sorted(name for name in os.listdir(finished) if name.startswith("checkpoint-")) == \
        ["checkpoint-2", "checkpoint-3"]


# --- merge_lora writes outside the run folder ----------------------------------------------------------------------
@pytest.mark.parametrize("where", ["run", "run/checkpoint-9", "run/checkpoint-1/merged"])
def test_merge_lora_never_writes_into_the_run_folder(tmp_path, capsys, where):
    from harness.merge_lora import main as export
    from tests.test_memory import lora_run
    lora_run(tmp_path / "run", "--steps", "1")
    capsys.readouterr()
    before = snapshot(tmp_path / "run")
    output = tmp_path / where
    error = one_line(capsys, [str(tmp_path / "run" / "latest"), str(output)], prog=export)
    assert ("already exists" if where == "run" else "inside the run folder") in error
    assert snapshot(tmp_path / "run") == before


# --- the message names the cause ----------------------------------------------------------------------------------
def test_a_resume_flag_that_conflicts_with_the_saved_settings_names_the_flag(tmp_path, capsys):
    run(tmp_path / "run", "--steps", "1", "--param-dtype", "bf16")
    error = one_line(capsys, ["--resume", str(tmp_path / "run"), "--dtype", "fp32", "--steps", "2"])
    assert error.startswith("train.py: error: --dtype with the run being resumed") and "--steps" not in error


def test_a_dry_run_refuses_what_the_run_refuses(tmp_path, capsys):
    error = one_line(capsys, ["--dry-run", "--device", "cpu", "--optimizer-offload", "--output-dir",
                              str(tmp_path / "run")], code=2)
    assert "--optimizer-offload" in error
