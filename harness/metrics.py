"""A run's metrics.jsonl: one JSON object per line with an integer "step" (train rows, and eval rows marked "eval").

Appended a row at a time (never truncated in place); read one line at a time, however long the file (a line longer
than MAX_METRICS_LINE is skipped, not read whole); rewritten only through a temporary file renamed into place (the
resume's cut back to its checkpoint's step). A half-written last line is what a kill leaves: dropped with a
warning; a bad line elsewhere is a RunError naming the file and the line.
"""
import contextlib
import json
import os

from harness.checkpoint import RunError, write_failed

MAX_METRICS_LINE = 1 << 20  # bytes: a longer line is not a metrics row


def append_metrics(path, row):
    try:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as error:
        raise RunError(write_failed(path, error) + ", then continue with --resume") from None


def metrics_rows(path, warn=print):
    """The rows of a metrics.jsonl, one at a time (memory bounded by one line, however long the file), each a JSON
    object with an integer "step". A half-written last line (a kill or a full disk mid-write) is dropped with a
    warning; a bad line elsewhere, or a path that is not a regular file, is a RunError naming it."""
    if not os.path.lexists(path):
        return
    if not os.path.isfile(path):
        raise RunError(f"{path} is not a regular file; move it away or use another --output-dir")
    with open(path, "rb") as f:
        pending = None  # (line number, row or None): judged once we know whether a line follows it
        for number, line in bounded_lines(f):
            if pending:
                yield _metrics_row(path, *pending, last=False, warn=warn)
            pending = (number, line)
        if pending:
            row = _metrics_row(path, *pending, last=True, warn=warn)
            if row is not None:
                yield row


def bounded_lines(f, chunk=1 << 16):
    """(line number, bytes) for each non-blank line of a binary file; a line longer than MAX_METRICS_LINE comes as
    None, skipped in chunks rather than read whole."""
    number = 0
    while True:
        line = f.readline(MAX_METRICS_LINE + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_METRICS_LINE and not line.endswith(b"\n"):
            while (rest := f.readline(chunk)) and not rest.endswith(b"\n"):
                pass
            line = None
        if line is None or line.strip():
            yield number, line


def _metrics_row(path, number, line, *, last, warn):
    try:
        row = json.loads(line) if line is not None else None
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


def rewrite_metrics(path, rows):
    """Replace the file with `rows` (an iterable; it may be read from the file itself, as the tmp file is written
    beside it), atomically: a kill mid-write leaves the old file, never an empty one."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(tmp, path)
    except OSError as error:
        raise RunError(write_failed(path, error)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)  # after a RunError from the rows themselves (a corrupt line)
