"""A training run's files, written so that a kill, a full disk or a read-only folder never loses what was there.

    <output-dir>/metrics.jsonl               one JSON row per step, plus eval rows (harness/metrics.py)
    <output-dir>/checkpoint-<step>/          save_pretrained folder + trainer_state.pt + run.json (the run's settings)
    <output-dir>/latest -> checkpoint-<step> switched only once the checkpoint folder is complete
    <output-dir>/.lock                       flocked by the run writing here (one run per folder): host, PID, start

Every write goes to a temporary name renamed into place; what a kill leaves (a
`checkpoint-<step>.tmp` holding the save's mark) is put right at the next start, and a copy without
that mark is a user's, and stays. Checkpoints load no code: trainer_state.pt is read with
`torch.load(weights_only=True)`. torch is imported only where needed.
"""
import contextlib
import filecmp
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import socket
import time

import numpy as np

from harness.files import (RunError, as_disk_full, not_data, open_nofollow, refuse_link,
                           refuse_unless_file, what_is, write_failed)
from harness.manifest import MANIFEST, file_sha256, verify_manifest, write_manifest
from harness.model import save_policy

TRAINER_STATE = "trainer_state.pt"
RUN_SETTINGS = "run.json"
RUN_SETTINGS_LIMIT = 1 << 20  # bytes: a run.json is ~2 KB
LOCK = ".lock"
OWN_FILES = ("metrics.jsonl", "metrics.jsonl.tmp", "unsaved-metrics.jsonl", "metrics.png")  # and LOCK: files a
# run appends to, truncates or replaces
RUN_FILES = ("metrics.jsonl", "latest")  # with checkpoint-<step>/: what makes a folder hold a run
RUN_OUTPUTS = ("metrics.png", "tensorboard", "wandb", "inspect")  # drawn from its metrics or steps (plot_metrics,
# --report-to, --inspect-every): an --overwrite deletes them too
SAVE_MARK = "saved_by_train.py"  # the first file a save writes: a checkpoint-<step>.tmp holding it is a save's own


# ---------------------------------------------------------------------------------------------------------------
# Links: a run writes, truncates and deletes only inside its folder, never through a link planted there
# ---------------------------------------------------------------------------------------------------------------
PRUNING = ".pruning"  # checkpoint-<step>.pruning: a checkpoint being deleted (renamed first, so a kill leaves no
# half-deleted checkpoint-<step>); recover() finishes the deletion


def run_owns(name):
    """Whether a run creates, rewrites or deletes <output-dir>/name: its lock, metrics and their temporaries, its
    checkpoints and `latest`, the outputs drawn from it (RUN_OUTPUTS) and the tiny model's warm-start caches."""
    return name in (LOCK, "latest.tmp", "metrics.jsonl.tmp", "unsaved-metrics.jsonl", *RUN_FILES, *RUN_OUTPUTS) \
        or re.match(r"(checkpoint-\d+|warm_start-)", name) is not None


def refuse_planted_links(output_dir):
    """A RunError naming the first entry of output_dir that the run owns (run_owns) and that is a
    link, except `latest` (or a kill's latest.tmp) linking to a checkpoint-<step> beside it; also an
    odd `latest` (refuse_odd_latest) and anything but a one-name regular file where the run keeps a
    file (OWN_FILES)."""
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if os.path.islink(path) and run_owns(name) and not (
                name in ("latest", "latest.tmp") and re.fullmatch(r"checkpoint-\d+", os.readlink(path))):
            refuse_link(path)
    refuse_unless_file(os.path.join(output_dir, "latest.tmp"), links=True)  # a folder or FIFO: not the run's
    for name in OWN_FILES:  # a hard link, FIFO, device or folder where the run keeps a file of its own
        refuse_unless_file(os.path.join(output_dir, name))
    refuse_odd_latest(output_dir)


# ---------------------------------------------------------------------------------------------------------------
# The run folder: one run at a time, leftovers of a kill, an existing run
# ---------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def locked(output_dir):
    """Hold <output_dir>/.lock for the block: an exclusive flock, released by the kernel however the
    process ends (no stale lock). The file says who holds it; a second run is a RunError naming
    them. The file stays: removing it would let two runs lock two different files."""
    import fcntl  # POSIX only, like the rest of the run's files
    path = os.path.join(output_dir, LOCK)
    try:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)  # a hard link, FIFO or folder there: a RunError naming it
    except OSError as error:
        raise RunError(f"cannot write {path}: {error.strerror or error}; use another --output-dir") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_text(fd)
            raise RunError(f"{output_dir} is in use by {holder} (another train.py run writes there); wait for it to "
                           "end, or use another --output-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def lock_holder(output_dir):
    """Who holds output_dir's lock (the text its holder wrote), or None when no live process holds it."""
    import fcntl
    try:
        fd = open_nofollow(os.path.join(output_dir, LOCK), os.O_RDONLY)  # never blocks on a FIFO
    except (OSError, RunError):  # none, or not a lock file (a link, a FIFO, ...): no run of ours holds that
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free: nobody holds it (released at once, below)
        return None
    except BlockingIOError:
        return _holder_text(fd)
    finally:
        os.close(fd)


def refuse_live_run(path):
    """A RunError naming the process when the run folder of --resume PATH is locked by a run still
    going, which saves and prunes checkpoints meanwhile (one that has saved none yet:
    resolve_checkpoint says so)."""
    real = os.path.realpath(path)
    for folder in (real, os.path.dirname(real)):
        holder = lock_holder(folder)
        if holder and checkpoint_steps(folder):
            raise RunError(f"--resume {path}: {folder} is in use by {holder} (its run is still going, saving and "
                           "pruning checkpoints); wait for it to end, or stop it first (it saves a checkpoint)")


def _holder_text(fd):
    """What the holder of a lock wrote in it: "process PID on HOST, started ..." (empty for an instant at its start)."""
    return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that is starting"


def checkpoint_step(run_dir, name):
    """The step of run_dir/name when it is one of the run's checkpoint folders: checkpoint-<step>, or the
    checkpoint-<step>.tmp of a save (marked as its own) that a kill interrupted; else None."""
    match = re.fullmatch(r"checkpoint-(\d+)(\.tmp)?", name)
    if os.path.islink(os.path.join(run_dir, name)):  # a link is never one of the run's own folders
        return None
    if match and (not match.group(2) or os.path.isfile(os.path.join(run_dir, name, SAVE_MARK))):
        return int(match.group(1))
    return None


def holds_a_run(output_dir):
    """The run files in output_dir (metrics.jsonl, latest, checkpoint-<step>/), sorted; [] when it holds none."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    return sorted(name for name in names if name in RUN_FILES or checkpoint_step(output_dir, name) is not None)


def remove_run(output_dir):
    """--overwrite: delete the run files of output_dir (not the tiny model's warm-start caches). Only a folder is
    removed as a tree; anything else (a file, a link, a FIFO) is unlinked, never opened (rmtree opens its path,
    which waits forever on a FIFO). A failure is a RunError naming the path."""
    for name in holds_a_run(output_dir) + [name for name in RUN_OUTPUTS
                                             if os.path.lexists(os.path.join(output_dir, name))]:
        path = os.path.join(output_dir, name)
        try:
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        except OSError as error:
            raise RunError(f"--overwrite could not delete {path}: {error.strerror or error}") from None


def is_complete(folder):
    """A checkpoint folder whose last file (run.json) was written, so everything before it was too."""
    return os.path.isfile(os.path.join(folder, TRAINER_STATE)) and os.path.isfile(os.path.join(folder, RUN_SETTINGS))


def recover(output_dir, log=print):
    """Put right what a kill during a save or prune left: a complete marked checkpoint-N.tmp without
    checkpoint-N becomes it, other marked .tmp folders and interrupted prunes go, and a `latest`
    pointing nowhere is pointed at the newest complete checkpoint. Unmarked folders stay; links are
    never followed."""
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        interrupted = re.fullmatch(r"checkpoint-\d+" + re.escape(PRUNING), name) or (
            checkpoint_step(output_dir, name) is not None and not name.endswith(".tmp") and not is_complete(path)
            and os.path.isfile(os.path.join(path, SAVE_MARK)))
        if interrupted and os.path.isdir(path) and not os.path.islink(path):  # never a FIFO: rmtree would open it
            try:
                shutil.rmtree(path)
            except OSError as error:  # a prune that failed for the same cause: said, and tried at each start
                log(f"note: could not remove {path}, a checkpoint whose deletion was interrupted ("
                    f"{error.strerror or error}); delete it by hand")
            else:
                log(f"note: removed {path}, a checkpoint whose deletion was interrupted")
            continue
        if empty_save_folder(output_dir, name):  # a kill between a save's mkdir and its mark: nothing in it
            os.rmdir(path)
            continue
        if not name.endswith(".tmp") or checkpoint_step(output_dir, name) is None:
            continue
        leftover, final = os.path.join(output_dir, name), os.path.join(output_dir, name[:-len(".tmp")])
        if is_complete(leftover) and not os.path.exists(final):
            os.replace(leftover, final)
            log(f"note: {final} restored from {name} (a save was interrupted)")
        else:
            shutil.rmtree(leftover, ignore_errors=True)
    latest = os.path.join(output_dir, "latest")
    with contextlib.suppress(FileNotFoundError):
        os.remove(latest + ".tmp")
    steps = checkpoint_steps(output_dir)
    if os.path.lexists(latest) and not is_complete(latest) and steps:
        point_latest(output_dir, steps[-1])
        log(f"note: {latest} pointed to a missing checkpoint; it now points to checkpoint-{steps[-1]}")


def empty_save_folder(output_dir, name):
    """Whether output_dir/name is an empty checkpoint-<step>.tmp folder (not a link): a kill's,
    before SAVE_MARK."""
    path = os.path.join(output_dir, name)
    return re.fullmatch(r"checkpoint-\d+\.tmp", name) is not None and os.path.isdir(path) and \
        not os.path.islink(path) and not os.listdir(path)


def refuse_odd_latest(output_dir):
    """A RunError naming <output_dir>/latest when it is what no save writes and no copy of a run makes: not a link
    and not a folder copying one of its checkpoints (a user's folder or file, a FIFO: never replaced or deleted)."""
    latest = os.path.join(output_dir, "latest")
    kind = what_is(latest)
    if kind is None or kind.startswith("a link") or (kind == "a directory" and latest_twin(output_dir) is not None):
        return
    raise RunError(f"{latest} is {kind}, where a run keeps its link to the newest checkpoint, and copies none of "
                   "its checkpoint-<step> folders; move it away")


def point_latest(output_dir, step):
    """Switch <output_dir>/latest to checkpoint-<step> atomically (a new symlink renamed over the old one). A
    `latest` folder is removed only when it copies one of the checkpoints (a run copied with cp -rL / scp -r);
    anything else there is a RunError naming it (refuse_odd_latest), as is anything but a link at latest.tmp."""
    latest = os.path.join(output_dir, "latest")
    refuse_unless_file(latest + ".tmp", links=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(latest + ".tmp")
    refuse_odd_latest(output_dir)
    os.symlink(f"checkpoint-{step}", latest + ".tmp")
    if os.path.isdir(latest) and not os.path.islink(latest):  # the twin folder of a copied run
        shutil.rmtree(latest)
    os.replace(latest + ".tmp", latest)


def later_checkpoints(output_dir, step):
    """The checkpoint-<s> folders with s > step: on a resumed run, the timeline being replaced."""
    return [f"checkpoint-{s}" for s in checkpoint_steps(output_dir) if s > step]


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------
def save_checkpoint(output_dir, step, model, tokenizer, trainer_state, settings, *, keep=2, log=print):
    """Write checkpoint-<step> (weights, tokenizer, trainer_state.pt, MANIFEST, then run.json),
    point `latest` at it, and keep the newest `keep` up to this step (0 = all; later ones, a
    replaced timeline, go). Any failure removes the partial folder, leaves `latest` as it was, and
    is one RunError."""
    import torch
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp, latest = final + ".tmp", os.path.join(output_dir, "latest")
    refuse_nonfinite_weights(model, step, output_dir)
    if os.path.lexists(tmp) and checkpoint_step(output_dir, os.path.basename(tmp)) is None and \
            not empty_save_folder(output_dir, os.path.basename(tmp)):
        raise RunError(f"{tmp} is in the way of this run's next save and is not one of its own; move it elsewhere, "
                       "then continue with --resume")
    kind = what_is(final)
    if kind not in (None, "a directory") or kind == "a directory" and not (
            is_complete(final) or os.path.isfile(os.path.join(final, SAVE_MARK))):  # merge_lora's OUT, a user's
        raise RunError(f"{final} is {kind} that this run did not write, in the way of its save at step {step} "
                       "(which would delete it); move it elsewhere, then continue with --resume")
    refuse_odd_latest(output_dir)  # planted during the run: named here, before the save's work
    refuse_unless_file(latest + ".tmp", links=True)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        with open(os.path.join(tmp, SAVE_MARK), "w") as f:  # first: recover() restores or removes only marked folders
            f.write("a checkpoint written by train.py (harness/checkpoint.py)\n")
        save_policy(model, tmp)  # a LoRA policy: its adapters only (harness/model.py)
        tokenizer.save_pretrained(tmp)
        weights = weight_digests(tmp)
        torch.save({**trainer_state, WEIGHTS_SHA256: weights, MANIFEST: True}, os.path.join(tmp, TRAINER_STATE))
        run_json = json.dumps(settings, indent=1, sort_keys=True).encode()
        write_manifest(tmp, {**weights, RUN_SETTINGS: hashlib.sha256(run_json).hexdigest()})
        with open(os.path.join(tmp, RUN_SETTINGS), "wb") as f:  # written last: the folder is complete once it exists
            f.write(run_json)
        if os.path.isdir(final) and not os.path.islink(final):  # a later checkpoint of a replaced timeline
            prune(final, log)  # renamed first: a kill midway leaves a .pruning folder, never half a checkpoint
        os.replace(tmp, final)
        point_latest(output_dir, step)  # atomic switch: `latest` is always a complete checkpoint
    except Exception as error:  # noqa: BLE001 -- whatever the writer raised, the run's files stay as they were
        error = as_disk_full(error, output_dir)  # before the partial folder goes (and frees its space)
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f" ({latest} still points to the previous checkpoint)" if os.path.lexists(latest) else ""
        raise RunError(write_failed(f"checkpoint {final}", error) + kept) from None
    earlier = [s for s in checkpoint_steps(output_dir) if s < step]
    pruned = earlier[:-(keep - 1) or None] if keep > 0 else []  # never the one just written
    for name in later_checkpoints(output_dir, step) + [f"checkpoint-{s}" for s in pruned]:
        prune(os.path.join(output_dir, name), log)
    return final


def prune(folder, log=print):
    """Delete a checkpoint folder: renamed to <folder>.pruning first, so a kill midway leaves no
    half-deleted checkpoint; a deletion that fails is one note, and the run goes on."""
    doomed = folder + PRUNING
    try:
        if os.path.isdir(doomed) and not os.path.islink(doomed):
            shutil.rmtree(doomed)  # an earlier prune's leftover
        os.replace(folder, doomed)
        folder = doomed
    except OSError:
        pass  # the rmtree below removes what it can
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        pass
    except OSError as error:
        log(f"note: could not delete {folder} ({error.strerror or error}), a checkpoint this run no longer keeps; "
            "delete it by hand (the run goes on; each start tries again)")


def then_resume(output_dir):
    """What to do after fixing what stopped a run: --resume when it has saved a checkpoint, else run
    it again."""
    saved = os.path.lexists(os.path.join(output_dir, "latest")) or checkpoint_steps(output_dir)
    return ", then continue with --resume" if saved else ", then run the command again (no checkpoint saved yet)"


def existing_copy(checkpoint_dir):
    """checkpoint_dir, or before recover() has run the complete .tmp copy it would restore as checkpoint_dir."""
    tmp = checkpoint_dir + ".tmp"
    marked = checkpoint_step(os.path.dirname(tmp), os.path.basename(tmp)) is not None
    return tmp if not is_complete(checkpoint_dir) and marked and is_complete(tmp) else checkpoint_dir


def checkpoint_steps(output_dir):
    """Sorted steps of the complete checkpoint-<step> folders in output_dir."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    steps = [int(m.group(1)) for m in map(re.compile(r"checkpoint-(\d+)$").match, names)
             if m and not os.path.islink(os.path.join(output_dir, m.group(0)))]
    return sorted(s for s in steps if is_complete(os.path.join(output_dir, f"checkpoint-{s}")))


def copied_latest(run_dir, log=print):
    """The checkpoint-<step> a `latest` folder (a run copied with cp -rL) copies (latest_twin);
    RunError if none."""
    step = latest_twin(run_dir)
    if step is not None:
        log(f"note: {run_dir}/latest is a folder, not a link (a copied run): resuming from checkpoint-{step}, "
            "its twin; the run's next checkpoint turns it back into a link")
        return os.path.join(run_dir, f"checkpoint-{step}")
    raise RunError(f"{run_dir}/latest is a folder that copies none of its checkpoint-<step> folders; resume from a "
                   "checkpoint-<step> folder")


def latest_twin(run_dir):
    """The step of the checkpoint-<step> that a `latest` folder copies (its trainer_state.pt byte for byte the
    same, a regular file), else None."""
    twin = os.path.join(run_dir, "latest", TRAINER_STATE)
    if os.path.islink(os.path.join(run_dir, "latest")) or what_is(twin) != "a file":
        return None
    return next((step for step in reversed(checkpoint_steps(run_dir)) if filecmp.cmp(
        twin, os.path.join(run_dir, f"checkpoint-{step}", TRAINER_STATE), shallow=False)), None)


def resolve_checkpoint(path, log=print):
    """--resume PATH: a checkpoint folder, or a run folder (-> its `latest`; when that points nowhere, the newest
    complete checkpoint, with a note), as a real path. A `latest` leading outside its run folder is refused: a
    resumed run writes only into the folder it was given. RunError if PATH is neither."""
    latest = os.path.join(path, "latest")
    if os.path.lexists(latest) or (os.path.isdir(path) and not os.path.isfile(os.path.join(path, RUN_SETTINGS))):
        run_dir = os.path.realpath(path)
        if os.path.lexists(latest) and os.path.dirname(os.path.realpath(latest)) != run_dir:
            raise RunError(f"{latest} points outside its run folder ({os.path.realpath(latest)}); resume from a "
                           "checkpoint-<step> folder instead")
        if os.path.isdir(latest) and not os.path.islink(latest) and is_complete(latest):
            return copied_latest(run_dir, log)
        if not is_complete(latest):
            complete = [os.path.join(run_dir, name) for name in os.listdir(run_dir)
                        if checkpoint_step(run_dir, name) is not None and is_complete(os.path.join(run_dir, name))]
            beside = instead_of(run_dir, otherwise=None) if re.fullmatch(
                r"checkpoint-\d+", os.path.basename(run_dir)) else None  # PATH: a checkpoint cut short, not a run
            if not complete and beside:
                raise RunError(f"--resume {path}: an incomplete checkpoint (a save or a deletion was interrupted); "
                               f"{beside} beside it, the newest complete one")
            if not complete:
                holder = lock_holder(run_dir)
                raise RunError(f"--resume {path}: no complete checkpoint in this folder; " + (
                    f"its run is still going ({holder}) and has saved none yet: wait for its first checkpoint"
                    if holder else "start the run again"))
            newest = max(complete, key=lambda p: int(re.search(r"checkpoint-(\d+)", p).group(1)))
            log(f"note: {latest} is missing or points to an incomplete checkpoint; resuming from "
                f"{os.path.basename(newest)}, the newest complete one")
            return newest
        path = latest
    elif os.path.dirname(os.path.realpath(path)) != os.path.realpath(os.path.dirname(os.path.abspath(path))):
        raise RunError(f"--resume {path}: a link to {os.path.realpath(path)}, outside the folder it stands in; a "
                       "resumed run writes only into its own run folder: resume from the checkpoint where it is")
    path = os.path.realpath(path)
    if not is_complete(path):
        good = instead_of(path, otherwise=None)
        raise RunError(f"--resume {path}: not a complete train.py checkpoint (no {RUN_SETTINGS} or "
                       f"{TRAINER_STATE}); " + (f"{good} beside it (the newest complete one)" if good else
                                                "pass a checkpoint-<step> folder or the run folder"))
    return path


def load_run_settings(checkpoint_dir):
    """The settings saved in run.json (a dict; config.Config checks its keys and values)."""
    path = os.path.join(checkpoint_dir, RUN_SETTINGS)
    try:
        if not_data(path) or not os.path.isfile(path) or os.path.getsize(path) > RUN_SETTINGS_LIMIT:
            raise ValueError(f"not a regular file of at most {RUN_SETTINGS_LIMIT} bytes")
        with open(path) as f:
            settings = json.load(f)
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: deeply nested JSON
        raise RunError(f"{path} is unreadable ({error}); resume from another checkpoint-<step>") from None
    if not isinstance(settings, dict):
        raise RunError(f"{path}: not a JSON object of settings; resume from another checkpoint-<step>")
    return settings


TRAINER_STATE_KEYS = {"step": int, "initial_eval": dict, "optimizer": dict, "rng": dict}


def load_trainer_state(checkpoint_dir):
    """The optimizer, RNG states and step saved with a checkpoint. Read with weights_only=True: a file that needs
    arbitrary Python objects unpickled (which can run code) is refused. RunError if missing, corrupt or wrong."""
    import torch
    path, hint = os.path.join(checkpoint_dir, TRAINER_STATE), instead_of(checkpoint_dir)
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" in str(error):
            unsafe = re.search(r"(?:Unsupported global|GLOBAL) ([\w.]+)", str(error))
            raise RunError(f"{path}: refused, it asks to unpickle {unsafe.group(1) if unsafe else 'Python objects'}"
                           f" (loading it could run code; train.py never writes that); {hint} only if you trust "
                           "where it came from") from None
        raise RunError(f"{path} is truncated or corrupt ({type(error).__name__}); {hint}") from None
    except (OSError, RuntimeError, EOFError, ValueError) as error:
        raise RunError(f"{path} is truncated or corrupt ({type(error).__name__}); {hint}") from None
    for key, kind in TRAINER_STATE_KEYS.items():
        if not isinstance(state, dict) or not isinstance(state.get(key), kind):
            raise RunError(f"{path}: no valid {key!r} in it; {hint}")
    named = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(checkpoint_dir))
    if isinstance(state["step"], bool) or state["step"] < 0 or (named and int(named.group(1)) != state["step"]):
        raise RunError(f"{path}: its 'step' {state['step']!r} is not the step of {os.path.basename(checkpoint_dir)}"
                       f"; {hint}")
    if not all(isinstance(state["initial_eval"].get(key), (int, float)) for key in ("pass@1", "reward")):
        raise RunError(f"{path}: no valid 'initial_eval' (pass@1, reward) in it; {hint}")
    saved = state.get(WEIGHTS_SHA256)  # absent in a checkpoint from before it was written: not checked
    if saved is not None and not (isinstance(saved, dict) and all(
            isinstance(name, str) and isinstance(digest, str) for name, digest in saved.items())):
        raise RunError(f"{path}: its {WEIGHTS_SHA256!r} is not a table of file names to sha256 digests; {hint}")
    if saved is not None and saved != weight_digests(checkpoint_dir):
        found = weight_digests(checkpoint_dir)
        name = sorted(name for name in set(saved) | set(found) if saved.get(name) != found.get(name))[0]
        raise RunError(f"{checkpoint_dir}/{name}: " + (
            "is not the weight file this checkpoint saved at its step (its sha256 differs from the one in "
            f"{TRAINER_STATE}: copied from another checkpoint?)" if name in saved and name in found else
            f"{'missing' if name in saved else 'a weight file this checkpoint did not save'}") + f"; {hint}")
    return state


WEIGHTS_SHA256 = "weights_sha256"  # trainer_state.pt's {file name: sha256} of the checkpoint's weight files


RESUME_NOTES = []  # resolve_checkpoint's notes on the checkpoint a resume takes: said once it passes its checks


def verify_checkpoint(checkpoint_dir, log=print, state=None):
    """A RunError naming the file when checkpoint_dir's files are not the set its save wrote: a file missing,
    changed (config.json, the tokenizer's, the weights, trainer_state.pt, run.json: its sha256 is not MANIFEST's),
    one the save did not write, or anything but a regular file; MANIFEST itself missing where trainer_state.pt says
    the save wrote one. A checkpoint from before MANIFEST was written: a note (its weights are checked by
    trainer_state.pt's digests, load_trainer_state). Reads every file once. Then RESUME_NOTES are said. state: its
    load_trainer_state, where the caller has read it already (else read here when MANIFEST is missing)."""
    hint = instead_of(checkpoint_dir)
    if not verify_manifest(checkpoint_dir, hint):
        state = load_trainer_state(checkpoint_dir) if state is None else state
        if state.get(MANIFEST):  # deleted: nothing binds the other files any more
            raise RunError(f"{checkpoint_dir}/{MANIFEST}: missing, though its save wrote one (its {TRAINER_STATE} "
                           f"says so); {hint}")
        log(f"note: {checkpoint_dir} was saved before checkpoints listed their files' sha256 ({MANIFEST}): only its "
            "weights are checked against its trainer_state.pt; the run's next checkpoint has one")
    for note in RESUME_NOTES:
        log(note)
    RESUME_NOTES.clear()


def weight_digests(folder):
    """{name: sha256 hex} of the weight files (*.safetensors: the policy's, or a LoRA run's adapters) in folder, read
    in blocks of 1 MiB: what binds a checkpoint's weights to its own step (load_trainer_state checks them)."""
    return {name: file_sha256(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if name.endswith(".safetensors") and os.path.isfile(os.path.join(folder, name))}


def instead_of(checkpoint_dir, otherwise="no other complete checkpoint: start the run again"):
    """What to resume from when checkpoint_dir is refused: the newest other complete checkpoint of its run, or
    `otherwise` when it has none."""
    others = [s for s in checkpoint_steps(os.path.dirname(checkpoint_dir))
              if f"checkpoint-{s}" != os.path.basename(checkpoint_dir)]
    return f"resume from checkpoint-{others[-1]}" if others else otherwise


def tensor_problem(value, dtype, shape=None):
    """What keeps value from being a finite tensor of `dtype` (and `shape`), as "is ..." text; None when nothing."""
    import torch
    if not torch.is_tensor(value):
        kind = type(value).__name__
        return f"is {'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}, not a tensor"
    if value.dtype != dtype:
        return f"is {str(value.dtype).removeprefix('torch.')}, not {str(dtype).removeprefix('torch.')}"
    if shape is not None and value.shape != shape:
        return f"has shape {tuple(value.shape)}, not {tuple(shape)}"
    if value.is_floating_point() and not torch.isfinite(value).all():
        return "is not finite (nan or inf)"
    return None


def refuse_nonfinite_weights(model, step, output_dir):
    """A RunError naming the weight when a trained weight of `model` holds a nan or inf, before anything of
    checkpoint-<step> is written: a checkpoint never holds one (resume would refuse it, check_weights)."""
    import torch
    for name, param in model.named_parameters():
        if param.requires_grad and param.is_floating_point() and not torch.isfinite(param).all():
            saved = checkpoint_steps(output_dir)
            raise RunError(f"step {step}: the policy's weight {name!r} holds nan or inf, so no checkpoint-{step} is "
                           "written; " + (f"--resume {output_dir} continues from checkpoint-{saved[-1]}, the last "
                                          "finite one (a lower --lr?)" if saved else "start the run again"))


def check_weights(checkpoint_dir, dtype, model):
    """A RunError naming the file and the tensor when a checkpoint's weight files (*.safetensors: the policy, or a
    LoRA run's adapters) hold one that is not finite (a nan fails the first rollout) or not of `dtype`, what
    --param-dtype saves (from_pretrained would cast an int64 one to whole numbers). Tensors that are not floating
    in the loaded `model` (an integer buffer) keep their own dtype. Read one tensor at a time."""
    from safetensors import safe_open
    kept = {name: value.dtype for name, value in model.state_dict().items() if not value.is_floating_point()}
    for name in sorted(os.listdir(checkpoint_dir)):
        path = os.path.join(checkpoint_dir, name)
        if not name.endswith(".safetensors"):
            continue
        try:
            with safe_open(path, framework="pt") as weights:
                problems = {key: tensor_problem(weights.get_tensor(key), kept.get(key, dtype))
                            for key in weights.keys()}
        except Exception as error:  # noqa: BLE001 -- a truncated or corrupt file: safetensors raises its own
            raise RunError(f"{path} is truncated or corrupt ({type(error).__name__}); "
                           f"{instead_of(checkpoint_dir)}") from None
        for key, problem in problems.items():
            if problem:
                raise RunError(f"{path}: weight {key!r} {problem}; {instead_of(checkpoint_dir)}")


# ---------------------------------------------------------------------------------------------------------------
# RNG states, as tensors and plain values (what weights_only=True loads)
# ---------------------------------------------------------------------------------------------------------------
def rng_state():
    import torch
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
            "python": {"version": version, "state": list(python_state), "gauss_next": gauss_next},
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng(rng):
    import torch
    torch.set_rng_state(rng["torch"])
    numpy = rng["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))
    python = rng["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
