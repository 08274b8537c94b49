"""A run's metrics.jsonl: one JSON object per line with an integer "step" (train rows, and eval rows marked "eval").

Appended a row at a time; read a line at a time (at most MAX_METRICS_LINE); rewritten only through a
temporary file renamed into place (a resume's cut back). A half-written last line (a kill's) is
dropped with a warning; a bad line elsewhere is a RunError naming it. Each line is strict JSON: nan
or inf is written as null.
"""
import json
import math
import os
import stat

from harness.checkpoint import then_resume
from harness.files import RunError, open_nofollow, replaced_file, what_is, write_failed

MAX_METRICS_LINE = 1 << 20  # bytes: a longer line is not a metrics row


def append_metrics(path, row):
    """Append one row (never through a link, a hard link or a FIFO put there during the run: open_nofollow)."""
    try:
        with os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as f:
            f.write(metrics_line(row))
    except OSError as error:
        raise RunError(write_failed(path, error) + then_resume(os.path.dirname(path) or ".")) from None


def metrics_line(row):
    """A row as one line of strict JSON (no NaN or Infinity, which strict readers refuse): a float nan or inf is
    written as null."""
    return json.dumps({key: None if isinstance(value, float) and not math.isfinite(value) else value
                       for key, value in row.items()}, allow_nan=False) + "\n"


def metrics_rows(path, warn=print):
    """The rows of a metrics.jsonl, one at a time (memory bounded by one line, however long the file), each a JSON
    object with an integer "step". A half-written last line (a kill or a full disk mid-write) is dropped with a
    warning; a bad line elsewhere, or a path that is not a regular file, is a RunError naming it."""
    if not os.path.lexists(path):
        return
    if not os.path.isfile(path):
        raise RunError(f"{path} is not a regular file ({what_is(os.path.realpath(path))}); move it away")
    with open_for_reading(path) as f:
        pending = None  # (line number, row or None): judged once we know whether a line follows it
        for number, line in bounded_lines(f):
            if pending:
                yield _metrics_row(path, *pending, last=False, warn=warn)
            pending = (number, line)
        if pending:
            row = _metrics_row(path, *pending, last=True, warn=warn)
            if row is not None:
                yield row


TOO_LONG, TOO_LONG_UNENDED = "too long", "too long, unended"  # what bounded_lines yields for such a line


def bounded_lines(f, chunk=1 << 16):
    """(line number, bytes) for each non-blank line of a binary file; a line longer than MAX_METRICS_LINE comes as
    TOO_LONG, or TOO_LONG_UNENDED when the file ends inside it, skipped in chunks rather than read whole."""
    number = 0
    while True:
        line = f.readline(MAX_METRICS_LINE + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_METRICS_LINE and not line.endswith(b"\n"):
            while (rest := f.readline(chunk)) and not rest.endswith(b"\n"):
                pass
            line = TOO_LONG if rest else TOO_LONG_UNENDED
        if isinstance(line, str) or line.strip():
            yield number, line


def _metrics_row(path, number, line, *, last, warn):
    if line == TOO_LONG or (line == TOO_LONG_UNENDED and not last):  # whatever it holds, no row of ours is that long
        raise RunError(f"{path}:{number}: a line of over {MAX_METRICS_LINE} bytes, where a metrics row is a few "
                       "hundred; this program never writes one: fix or delete that line")
    try:
        row = json.loads(line) if isinstance(line, bytes) else None
    except ValueError:
        row = None
    if isinstance(row, dict) and isinstance(row.get("step"), int):
        return row
    if not last or isinstance(row, (dict, list)):  # not an interrupted write: corruption
        raise RunError(f"{path}:{number}: not a metrics row (a JSON object with an integer \"step\"); fix or "
                       "delete that line")
    warn(f"warning: {path}:{number}: dropped a half-written last row")
    return None


def read_metrics(path, warn=print):
    """All rows of a metrics.jsonl as a list (see metrics_rows)."""
    return list(metrics_rows(path, warn))


def open_for_reading(path):
    """A binary file object for the regular file at path (a link followed), opened without blocking: a FIFO or
    device put there after the caller's check is a RunError naming it, never waited on or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        kind = what_is(path, os.fstat(fd))
        os.close(fd)
        raise RunError(f"{path} is not a regular file ({kind}); move it away")
    return os.fdopen(fd, "rb")


def rewrite_metrics(path, rows):
    """Replace the file with `rows` (an iterable; it may be read from the file itself, as the tmp file is written
    beside it), atomically (replaced_file): a kill mid-write leaves the old file, never an empty one. The temporary
    metrics.jsonl.tmp is a new file: a leftover one is removed first, a link in its place is a RunError and stays."""
    try:
        with replaced_file(path, tmp=path + ".tmp") as f:
            f.writelines(map(metrics_line, rows))
    except OSError as error:
        raise RunError(write_failed(path, error)) from None


def rollout_stats(task, rollouts, rewards, advantages):
    """A step's batch before its update: rewards, pass rate, zero-variance groups, lengths (python floats)."""
    group_rewards = rewards.view(-1, rollouts.num_generations)  # [G, M]
    return {"reward_mean": rewards.mean().item(),
            "pass_rate": (rewards >= task.pass_threshold).float().mean().item(),
            "zero_var_share": (group_rewards.max(1).values == group_rewards.min(1).values).float().mean().item(),
            "adv_abs_mean": advantages.abs().mean().item(),
            "response_length": rollouts.completion_mask.sum().item() / len(rewards),
            "truncated_share": rollouts.truncated.float().mean().item()}
