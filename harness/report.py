"""--report-to tensorboard,wandb: the run's metrics as the loggers people already use show them.

metrics.jsonl stays the source of truth; each row goes here too, with the held-out greedy samples at
each eval. Details: docs/runs.md.
"""
import errno
import functools
import logging
import os
import sys
import tempfile
import threading

from harness.checkpoint import then_resume
from harness.config import InputError
from harness.files import RunError, refuse_link, write_failed
from harness.flags import check_wandb_login, require_library, wandb_failed

SAMPLES_LOGGED = 8  # greedy completions in each eval's table


def open_reporters(config, first_step):
    writers = []
    for name in filter(None, (config.report_to or "").split(",")):  # the loggers --report-to names, in order
        if name == "tensorboard":
            require_library("tensorboard", "--report-to tensorboard")
            from torch.utils.tensorboard import SummaryWriter
            folder = refuse_link(os.path.join(config.output_dir, "tensorboard"))
            threading.excepthook = quiet_writer_thread
            try:
                writers.append(TensorBoard(SummaryWriter(folder, purge_step=first_step or None), folder))
            except OSError as error:  # a full disk, a file in the folder's place: before the run's folder changes
                Reporters(writers).close()
                raise RunError(write_failed(f"the TensorBoard log {folder}", error)) from None
        elif name == "wandb":
            require_library("wandb", "--report-to wandb")
            import wandb
            check_wandb_login(config)  # a key wandb.init finds without asking: it never prompts
            folder = refuse_link(os.path.join(config.output_dir, "wandb"))
            try:  # wandb.init meets a full disk in its own log handler, which prints a traceback per failed write
                check_writable(folder)
            except OSError as error:  # a full disk, a file in the folder's place: before the run's folder changes
                Reporters(writers).close()
                raise RunError(write_failed(f"the W&B log {folder}", error)) from None
            try:
                run = wandb.init(project=os.environ.get("WANDB_PROJECT", "softmax-grpo-lopti"),
                                 name=os.path.basename(os.path.abspath(config.output_dir)), id=config.wandb_run_id,
                                 resume="allow", dir=config.output_dir, config=config.saved())
            except wandb.errors.Error as error:  # not logged in, no network: W&B's own errors, not a bug here
                Reporters(writers).close()
                raise InputError(wandb_failed(error, config.output_dir)) from None
            writers.append(WandB(wandb, run, folder))
    return Reporters(writers)


def no_room(folder):
    """An OSError (EROFS, ENOSPC) if folder's filesystem is read-only or full (f_blocks 0: never)"""
    stats = os.statvfs(folder)
    code = errno.EROFS if stats.f_flag & os.ST_RDONLY else errno.ENOSPC if stats.f_blocks and not stats.f_bavail \
        else None
    return OSError(code, os.strerror(code), folder) if code else None


PROBE_BYTES = 64 * 1024  # check_writable's test write: about what W&B writes as its run opens


def check_writable(folder):
    os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=".write-test-", dir=folder)  # a new file (O_EXCL, O_NOFOLLOW)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.remove(path)


def prompt_text(prompt):
    if isinstance(prompt, str):
        return prompt
    return next((message["content"] for message in reversed(prompt) if message.get("role") == "user"), "")


class Reporters:
    """Fan-out of rows and eval samples to the loggers. A failed write stops the run in one line (a
    RunError); closing never raises (every row is in metrics.jsonl): a failure there is a note."""

    def __init__(self, writers):
        self.writers = writers

    def row(self, row):
        prefix = "eval/" if row.get("eval") else "train/"
        scalars = {prefix + key: float(value) for key, value in row.items() if key not in ("step", "eval")
                   and isinstance(value, (int, float))}
        self.each("scalars", scalars, row["step"])

    def samples(self, step, samples, prompts=None):
        rows = [(prompt, completion, reward) for (completion, reward), prompt
                in zip(samples[:SAMPLES_LOGGED], [*(prompts or []), *[""] * SAMPLES_LOGGED])]
        self.each("samples", rows, step)

    def each(self, method, *args):
        for writer in self.writers:
            try:
                getattr(writer, method)(*args)
            except OSError as error:
                hint = then_resume(os.path.dirname(writer.folder))  # writer.folder: <output-dir>/<logger>
                raise RunError(write_failed(writer.folder, error) + hint) from None

    def close(self):
        for writer in self.writers:
            try:
                writer.close()
            except OSError as error:
                print(f"note: {write_failed(writer.folder, error, otherwise='')} (closing it; metrics.jsonl has "
                      "every row)", file=sys.stderr)


def quiet_writer_thread(args, previous=threading.excepthook):
    """threading.excepthook, quiet on TensorBoard's writer thread's OSError (raised again later)."""
    if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
        return
    previous(args)


class TensorBoard:
    def __init__(self, writer, folder):
        self.writer, self.folder = writer, folder

    def scalars(self, scalars, step):
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a run being watched: each row visible at once

    def samples(self, samples, step):
        escaped = lambda text: repr(text[:300]).replace("|", "\\|")  # noqa: E731  (a | would end the cell)
        table = "| reward | prompt | completion |\n|---|---|---|\n" + "".join(
            f"| {reward:.3f} | {escaped(prompt)} | {escaped(completion)} |\n"
            for prompt, completion, reward in samples)
        self.writer.add_text("eval/samples", table, step)

    def close(self):
        self.writer.close()


class WandB:
    """A W&B run in folder. A failed write there stops the run (Reporters), however W&B meets it:
    its log handler's first error is kept (failed_write) and raised after a row, else no_room's."""

    def __init__(self, wandb, run, folder):
        self.wandb, self.run, self.folder = wandb, run, folder
        self.error, self.reported = None, False
        inside = os.path.realpath(folder) + os.sep
        for handler in logging.getLogger("wandb").handlers:
            if isinstance(handler, logging.FileHandler) and os.path.realpath(handler.baseFilename).startswith(inside):
                handler.handleError = functools.partial(self.failed_write, handler.handleError)

    def failed_write(self, handle_error, record):
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            return handle_error(record)
        self.error = self.error or error

    def raise_failed_write(self):
        error = self.error or no_room(self.folder)
        if error is not None and not self.reported:
            self.reported = True
            raise error

    def scalars(self, scalars, step):
        self.run.log(scalars, step=step)
        self.raise_failed_write()

    def samples(self, samples, step):
        table = self.wandb.Table(columns=["prompt", "completion", "reward"], data=[list(row) for row in samples])
        self.run.log({"eval/samples": table}, step=step)
        self.raise_failed_write()

    def close(self):
        self.run.finish()
        self.raise_failed_write()
