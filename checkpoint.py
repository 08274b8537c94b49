"""A training run's files, written so that a kill, a full disk or a read-only folder never loses what was there.

    <output-dir>/metrics.jsonl               one JSON row per step, plus eval rows; appended, never truncated in place
    <output-dir>/checkpoint-<step>/          save_pretrained folder + trainer_state.pt + run.json (the run's settings)
    <output-dir>/latest -> checkpoint-<step> switched only once the checkpoint folder is complete

Every write goes to a temporary name first and is renamed into place (`os.replace` is atomic on one file system),
and the last `keep` checkpoints are kept. Problems a user can act on raise RunError: one line that names the file
and what to do.
"""
import json
import os
import random
import pickle
import re
import shutil

import numpy as np
import torch

TRAINER_STATE = "trainer_state.pt"
RUN_SETTINGS = "run.json"


class RunError(Exception):
    """A one-line problem with the run's files (train.py prints it and exits with code 1)."""


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------
def save_checkpoint(output_dir, step, model, tokenizer, trainer_state, settings, *, keep=2):
    """Write checkpoint-<step> (weights, tokenizer, trainer_state.pt, run.json), point `latest` at it, keep the
    newest `keep` checkpoints (0 = all). On failure the partial folder is removed and `latest` is untouched."""
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp, latest = final + ".tmp", os.path.join(output_dir, "latest")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, os.path.join(tmp, TRAINER_STATE))
        with open(os.path.join(tmp, RUN_SETTINGS), "w") as f:
            json.dump(settings, f, indent=1, sort_keys=True)
        if os.path.exists(final):  # the same step saved again (a resumed run): move the old one aside first
            shutil.rmtree(final + ".old", ignore_errors=True)
            os.replace(final, final + ".old")
        os.replace(tmp, final)
        shutil.rmtree(final + ".old", ignore_errors=True)
        if os.path.lexists(latest + ".tmp"):
            os.remove(latest + ".tmp")
        os.symlink(os.path.basename(final), latest + ".tmp")
        os.replace(latest + ".tmp", latest)  # atomic switch: `latest` is always a complete checkpoint
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"could not write checkpoint {final}: {error.strerror or error}; free some disk space or "
                       f"use another --output-dir ({latest} still points to the previous checkpoint)") from None
    if keep > 0:
        for old in checkpoint_steps(output_dir)[:-keep]:
            shutil.rmtree(os.path.join(output_dir, f"checkpoint-{old}"), ignore_errors=True)
    return final


def checkpoint_steps(output_dir):
    """Sorted steps of the complete checkpoint-<step> folders in output_dir."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    return sorted(int(m.group(1)) for m in map(re.compile(r"checkpoint-(\d+)$").match, names) if m)


def resolve_checkpoint(path):
    """A checkpoint folder, or a run folder (-> its `latest`), as a real path; RunError if it is neither."""
    if os.path.isdir(os.path.join(path, "latest")):
        path = os.path.join(path, "latest")
    path = os.path.realpath(path)
    if not os.path.isfile(os.path.join(path, RUN_SETTINGS)):
        raise RunError(f"--resume {path}: not a train.py checkpoint (no {RUN_SETTINGS}); pass a checkpoint-<step> "
                       "folder or the run folder")
    return path


def load_run_settings(checkpoint_dir):
    path = os.path.join(checkpoint_dir, RUN_SETTINGS)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise RunError(f"{path} is unreadable ({error}); resume from another checkpoint-<step>") from None


def load_trainer_state(checkpoint_dir):
    """The optimizer, RNG states and step saved with a checkpoint; RunError if the file is missing or corrupt."""
    path = os.path.join(checkpoint_dir, TRAINER_STATE)
    try:
        return torch.load(path, weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as error:
        others = [s for s in checkpoint_steps(os.path.dirname(checkpoint_dir))
                  if f"checkpoint-{s}" != os.path.basename(checkpoint_dir)]
        hint = f"resume from checkpoint-{others[-1]}" if others else "start the run again"
        raise RunError(f"{path} is truncated or corrupt ({type(error).__name__}); {hint}") from None


# ---------------------------------------------------------------------------------------------------------------
# metrics.jsonl
# ---------------------------------------------------------------------------------------------------------------
def append_metrics(path, row):
    try:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as error:
        raise RunError(f"could not write {path}: {error.strerror or error}; free some disk space, then continue "
                       "with --resume") from None


def read_metrics(path, warn=print):
    """The rows of a metrics.jsonl. A half-written last line (a kill or a full disk mid-write) is dropped with a
    warning; a bad line elsewhere is a RunError naming its line number."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        numbered = [(number, line) for number, line in enumerate(f, start=1) if line.strip()]
    rows = []
    for index, (number, line) in enumerate(numbered):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if index < len(numbered) - 1:  # not the last row: corruption, not an interrupted write
                raise RunError(f"{path}:{number}: not a JSON row; fix or delete that line") from None
            warn(f"warning: {path}:{number}: dropped a half-written last row")
    return rows


def rewrite_metrics(path, rows):
    """Replace the file with `rows`, atomically: a kill mid-write leaves the old file, never an empty one."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(tmp, path)
    except OSError as error:
        raise RunError(f"could not write {path}: {error.strerror or error}; free some disk space or use another "
                       "--output-dir") from None


# ---------------------------------------------------------------------------------------------------------------
# RNG states
# ---------------------------------------------------------------------------------------------------------------
def rng_state():
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng(rng):
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
