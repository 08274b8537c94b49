"""A run writes only inside its folder: a link planted there, to a file or folder outside, is refused in one line and
what it points to is left as it was, byte for byte. Every link here points into the test's own tmp folder."""
import os

import pytest

from harness import checkpoint, files, metrics
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
    from harness import flags, tiny
    settings = flags.load(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL])
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
    with pytest.raises(files.RunError, match="metrics.jsonl.tmp is a link"):
        metrics.rewrite_metrics(str(path), metrics.read_metrics(str(path)))
    assert target.read_text() == "years of work\n" and path.read_text() == '{"step": 1}\n'
    (tmp_path / "other.jsonl").symlink_to(target)
    with pytest.raises(files.RunError, match="other.jsonl is a link"):
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
    assert "--output-dir" not in error  # a flag inspect_step does not have


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
    with pytest.raises(files.RunError, match="latest is a link"):
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


# --- not only symbolic links: a hard link, a FIFO, a device or a folder where the run keeps a file -----------------
@pytest.fixture
def no_hang():
    """Fails the test instead of hanging the suite when it blocks for 30 s (a FIFO opened for reading or writing
    without O_NONBLOCK waits for a peer that never comes)."""
    import signal

    def expired(signum, frame):
        raise TimeoutError("blocked for 30 s: a FIFO was opened without O_NONBLOCK")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 30)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_a_hard_linked_lock_is_refused_and_its_other_name_is_unchanged(finished, outside, capsys):
    """O_NOFOLLOW stops a symbolic link, not a hard link: the lock's truncate and write would rewrite thesis.txt."""
    os.remove(finished / ".lock")
    os.link(outside / "thesis.txt", finished / ".lock")
    error = one_line(capsys, ["--resume", str(finished), "--steps", "3"])
    assert f"{finished / '.lock'} is a hard link (one of 2 names of a file)" in error
    assert (outside / "thesis.txt").read_text() == "years of work\n"


@pytest.mark.parametrize("how", ["resume", "fresh", "overwrite"])
def test_a_fifo_or_folder_named_lock_is_one_line_and_never_waited_on(finished, tmp_path, capsys, no_hang, how):
    folder = tmp_path / "empty" if how == "fresh" else finished
    folder.mkdir(exist_ok=True)
    with __import__("contextlib").suppress(FileNotFoundError):
        os.remove(folder / ".lock")
    os.mkfifo(folder / ".lock")
    argv = ["--resume", str(folder), "--steps", "3"] if how == "resume" else \
        ["--task", "digits", "--output-dir", str(folder), *SMALL] + (["--overwrite"] if how == "overwrite" else [])
    assert f"{folder / '.lock'} is a FIFO (named pipe)" in one_line(capsys, argv)
    assert checkpoint.lock_holder(str(folder)) is None  # experiments.inspect_step's question: no run holds it
    os.remove(folder / ".lock")
    os.mkdir(folder / ".lock")
    assert f"{folder / '.lock'} is a directory" in one_line(capsys, argv)


def test_a_fifo_or_hard_link_put_in_place_of_metrics_during_a_run_is_refused(tmp_path, outside, no_hang):
    path = tmp_path / "metrics.jsonl"
    os.mkfifo(path)
    with pytest.raises(files.RunError, match="metrics.jsonl is a FIFO"):
        metrics.append_metrics(str(path), {"step": 2})
    os.remove(path)
    os.link(outside / "thesis.txt", path)
    with pytest.raises(files.RunError, match="metrics.jsonl is a hard link"):
        metrics.append_metrics(str(path), {"step": 2})
    assert (outside / "thesis.txt").read_text() == "years of work\n"


def test_a_hard_linked_metrics_file_is_refused_before_a_resume_appends_to_it(finished, tmp_path, capsys):
    backup = tmp_path / "backup.jsonl"  # cp -al: one file, two names
    os.link(finished / "metrics.jsonl", backup)
    before = backup.read_bytes()
    assert "metrics.jsonl is a hard link" in one_line(capsys, ["--resume", str(finished / "checkpoint-1"),
                                                               "--steps", "2"])
    assert backup.read_bytes() == before


def test_a_folder_named_latest_that_copies_no_checkpoint_is_refused_never_deleted(finished, capsys):
    os.remove(finished / "latest")
    (finished / "latest").mkdir()
    (finished / "latest" / "notes.txt").write_text("mine\n")
    error = one_line(capsys, ["--resume", str(finished / "checkpoint-1"), "--steps", "3"])
    assert f"{finished / 'latest'} is a directory" in error
    assert (finished / "latest" / "notes.txt").read_text() == "mine\n"


def test_a_folder_planted_at_latest_tmp_during_a_run_is_named(finished):
    (finished / "latest.tmp").mkdir()
    with pytest.raises(files.RunError, match="latest.tmp is a directory"):
        checkpoint.point_latest(str(finished), 1)
    assert os.path.isdir(finished / "latest.tmp") and os.readlink(finished / "latest") == "checkpoint-2"


def test_a_checkpoint_folder_the_run_did_not_write_is_not_deleted_by_its_save(finished, capsys):
    """merge_lora's OUT, or a user's folder, named checkpoint-3: the save at step 3 refuses, never deletes it."""
    (finished / "checkpoint-3").mkdir()
    (finished / "checkpoint-3" / "model.safetensors").write_text("merged weights\n")
    error = one_line(capsys, ["--resume", str(finished), "--steps", "3"])
    assert f"{finished / 'checkpoint-3'} is a directory that this run did not write" in error
    assert (finished / "checkpoint-3" / "model.safetensors").read_text() == "merged weights\n"


def test_merge_lora_refuses_an_out_inside_another_run_folder(finished, tmp_path, capsys):
    from harness.merge_lora import main as export
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"step": 0}\n')  # a run that has not saved yet: its save would delete it
    error = one_line(capsys, [str(finished / "latest"), str(other / "checkpoint-7")], prog=export)
    assert f"inside the run folder {other}" in error and not os.path.exists(other / "checkpoint-7")


def test_a_pruning_folder_that_cannot_be_removed_is_not_said_removed(finished, monkeypatch):
    import shutil
    os.rename(finished / "checkpoint-1", finished / "checkpoint-1.pruning")
    real_rmtree = shutil.rmtree

    def refused(path, *args, **kwargs):
        if str(path).endswith(checkpoint.PRUNING):
            raise PermissionError(13, "Permission denied", str(path))
        return real_rmtree(path, *args, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", refused)
    notes = []
    checkpoint.recover(str(finished), log=notes.append)
    assert len(notes) == 1 and notes[0].startswith(f"note: could not remove {finished / 'checkpoint-1.pruning'}")
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    notes.clear()
    checkpoint.recover(str(finished), log=notes.append)
    assert notes == [f"note: removed {finished / 'checkpoint-1.pruning'}, a checkpoint whose deletion was "
                     "interrupted"] and not os.path.lexists(finished / "checkpoint-1.pruning")


# --- what lab and experiments write: never through a link, a hard link or a FIFO ---------------------------------
def write_code(path):
    from experiments.runs import record_code
    assert os.path.basename(path) == "code.json"
    record_code(os.path.dirname(path))


def write_table(path):
    from experiments import write_csv
    write_csv(path, [{"a": 1}])


def write_picture(path):
    from experiments import pyplot, write_figure
    plt = pyplot("the figure")
    if plt is None:
        pytest.skip("matplotlib is not installed")
    fig = plt.figure()
    write_figure(fig, path, dpi=10)
    plt.close(fig)


@pytest.mark.parametrize("write, name", [(write_code, "code.json"), (write_table, "fig1_prompt_weight.csv"),
                                         (write_picture, "fig1_prompt_weight.png")])
@pytest.mark.parametrize("planted", ["link", "hard link", "FIFO"])
def test_lab_and_experiments_outputs_are_never_written_through_what_is_planted(tmp_path, outside, capsys, no_hang,
                                                                               write, name, planted):
    path = tmp_path / "run" / name
    path.parent.mkdir()
    {"link": lambda: path.symlink_to(outside / "thesis.txt"), "FIFO": lambda: os.mkfifo(path),
     "hard link": lambda: os.link(outside / "thesis.txt", path)}[planted]()
    if planted == "link":  # replaced by the file, never followed
        write(str(path))
        assert not os.path.islink(path) and path.stat().st_size > 0
    else:
        with pytest.raises(SystemExit) as exit_info:
            write(str(path))
        assert f"{path} is a {planted}" in str(exit_info.value.code) and "\n" not in str(exit_info.value.code)
    assert (outside / "thesis.txt").read_text() == "years of work\n"
    assert sorted(os.listdir(path.parent)) == [name]  # no temporary left beside it


def test_a_temporary_a_killed_writer_left_is_removed_by_the_next_write(tmp_path):
    from experiments import write_csv
    leftover = tmp_path / ".table.csv.tmp-999999999-abc123"  # beyond any PID: its process is gone
    leftover.write_text("half")
    ours = tmp_path / f".table.csv.tmp-{os.getppid()}-abc123"  # a live process's (the parent): left alone
    ours.write_text("in progress")
    write_csv(str(tmp_path / "table.csv"), [{"a": 1}])
    assert sorted(os.listdir(tmp_path)) == [ours.name, "table.csv"]


def test_a_fifo_in_place_of_a_metrics_file_or_a_gguf_is_named_not_missing(tmp_path, no_hang):
    from experiments import plot_metrics
    from harness.model import model_source
    os.mkfifo(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match=r"metrics.jsonl is a FIFO \(named pipe\), not a metrics file"):
        plot_metrics.read_metrics(str(tmp_path))
    os.mkfifo(tmp_path / "model.gguf")
    with pytest.raises(ValueError, match=r"model.gguf is a FIFO \(named pipe\); pass a model folder"):
        model_source(str(tmp_path / "model.gguf"))


@pytest.mark.parametrize("name", ["metrics.png", "checkpoint-7", "checkpoint-1.pruning"])
def test_a_fifo_where_a_start_deletes_is_unlinked_or_left_never_opened(finished, capsys, no_hang, name):
    """shutil.rmtree opens its path, and waits forever on a FIFO: --overwrite unlinks it (it holds nothing), the
    start's clean-up of an interrupted prune leaves it."""
    os.mkfifo(finished / name)
    checkpoint.recover(str(finished), log=print)
    assert os.path.lexists(finished / name) and "removed" not in capsys.readouterr().out
    checkpoint.remove_run(str(finished))  # a .pruning name is no run file: --overwrite leaves it too
    assert os.path.lexists(finished / name) == name.endswith(".pruning")
    assert not checkpoint.holds_a_run(str(finished))


def test_a_replaced_file_keeps_its_mode(tmp_path):
    """benchmarks.memory_check --recipe-lines rewrites the recipes, which are executable."""
    path = tmp_path / "recipe.sh"
    path.write_text("#!/bin/sh\n")
    os.chmod(path, 0o755)
    with files.replaced_file(str(path)) as f:
        f.write("#!/bin/sh\necho\n")
    assert path.read_text() == "#!/bin/sh\necho\n" and oct(path.stat().st_mode & 0o777) == "0o755"


def test_a_file_planted_where_the_step_pages_go_is_named(tmp_path):
    from harness.step_page import write_page
    (tmp_path / "inspect").write_text("mine\n")
    with pytest.raises(files.RunError, match=r"inspect is a file, where the step's pages go"):
        write_page(str(tmp_path / "inspect" / "step-3.html"), "<html>")
    assert (tmp_path / "inspect").read_text() == "mine\n"
