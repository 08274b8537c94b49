"""The reward worker's far side (harness/reward_worker.py): the keeper, which runs no task code, and
below it the worker, which builds the task and answers the trainer's requests. Imported by a fresh
interpreter (RewardWorker.start), so it imports no torch and little of the harness.
"""
import contextlib
import json
import os
import pickle
import shutil
import signal
import struct
import sys
import time
import traceback

import tasks

FLUSH_S = 0.05  # the worker sends a batch's rewards back at least this often (the trainer's clock reads them)
POLL_S = 0.5  # the trainer looks at its clock, a stop signal and the keeper at least this often while it waits
FORKED = 86  # the exit code of a worker's child that returned from a task's call: it ends there
HEADER = struct.Struct(">Q")  # a message: its length, then its pickle (to the worker) or its JSON (back)
SHOWN = 4000  # characters of an exception's message sent back


def framed(data):
    """A message as it crosses a pipe: its length (HEADER), then its bytes."""
    return HEADER.pack(len(data)) + data


def first_argument(error):  # '(its repr, cut)', or '' (none, or one without a repr)
    try:
        return f"({repr(error.args[0])[:40]})" if error.args else ""
    except Exception:  # noqa: BLE001 -- a __repr__ that raises, args that are no tuple
        return ""


def prctl(option, value):
    """Linux's prctl(2): 1 = PR_SET_PDEATHSIG, 36 = PR_SET_CHILD_SUBREAPER (elsewhere the worker ends alone)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def keep(requests, results, trainer, scratch):
    """The keeper, a child subreaper running no task code, whose child, the worker, serves the task. When the worker
    ends, the trainer ends it (SIGTERM) or dies, it kills all below it, removes the scratch folder
    and exits as the worker did. Its signals are blocked, waited for: none interrupts it."""
    waited = {signal.SIGTERM, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    prctl(36, 1)
    prctl(1, signal.SIGTERM)
    keeper, worker, status = os.getpid(), os.fork(), None
    if worker == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
        prctl(1, signal.SIGKILL)  # the keeper killed: the worker too
        try:
            os.getppid() == keeper and serve(requests, results)
        except BaseException:  # noqa: BLE001 -- a bug here: its traceback, then the worker ends
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(requests)
    os.close(results)
    try:
        while status is None and os.getppid() == trainer:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)  # the worker, or an orphan that ended
            status = wait_status if pid == worker else None
            if not pid and getattr(signal.sigtimedwait(waited, POLL_S), "si_signo", 0) == 15:
                break  # SIGTERM
    finally:  # each child killed and reaped, until none is left (the worker's orphans come here)
        with contextlib.suppress(ProcessLookupError):
            status is None and os.kill(worker, signal.SIGKILL)
        while True:
            for pid in processes("stat", lambda s: int(s.rsplit(b")")[-1].split()[1]) == keeper):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                pid, wait_status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            status = wait_status if pid == worker else status
        shutil.rmtree(scratch, ignore_errors=True)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def processes(name, test):
    """The PIDs whose /proc/PID/name (bytes) passes test ([] without /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        with contextlib.suppress(OSError, ValueError, IndexError), \
                open(f"/proc/{pid}/{name}", "rb") as f:
            if test(f.read()):
                found.append(int(pid))
    return found


def read_message(fd, buffer):
    """-> (message, rest of buffer), or (EOFError, b"") when the trainer closed the channel."""
    while len(buffer) < HEADER.size or len(buffer) < HEADER.size + HEADER.unpack_from(buffer)[0]:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return EOFError, b""
        buffer += chunk
    size = HEADER.unpack_from(buffer)[0]
    return pickle.loads(buffer[HEADER.size:HEADER.size + size]), buffer[HEADER.size + size:]


def serve(requests, results):
    """The worker's loop: build the task (the recipe, first message), then answer each request."""
    for fd in (requests, results):  # a program a reward starts (os.system('x &')) never holds the channel
        os.set_inheritable(fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the trainer's
    pid, buffer = os.getpid(), b""
    recipe, buffer = read_message(requests, buffer)
    if recipe is EOFError:
        return
    sys.path[:] = recipe["sys_path"]
    turn = 0  # the request's number: each message back names it (RewardWorker.read_record)

    def send(message):
        data = framed(json.dumps([turn, *message]).encode())
        while data:
            data = data[os.write(results, data):]

    def guarded(what, call, *args, **kwargs):
        """call(...) -> (True, value), or (False, the error's report); a child forked inside never returns."""
        try:
            return True, call(*args, **kwargs)
        except BaseException as error:  # noqa: B036 (everything the task raises is reported to the trainer)
            if os.getpid() != pid:
                raise
            return False, report(error)
        finally:
            if os.getpid() != pid:  # a child the call forked, back in the worker's code: it ends here
                try:
                    send(("error", {"kind": "forked", "what": what}))
                finally:
                    os._exit(FORKED)

    ok, task = guarded("build", build_task, recipe)
    if not ok:  # it was built in the trainer: a TaskError here is the task's (its data changed), else a bug
        send(("error", task))
        return
    send(("done", None))
    while True:
        message, buffer = read_message(requests, buffer)
        turn += 1
        if message is EOFError:
            return
        if message[0] == "call":
            _, method, args, kwargs = message
            ok, value = guarded(f"{method}()", getattr(task, method), *args, **kwargs)
            if ok:  # a reward as its float; rows as the JSON the trainer gets (lists, no nan)
                ok, value = guarded(f"{method}()", tasks.reward_number, value, f"task {task.name}", args[0]) \
                    if method == "reward" else guarded(f"{method}()", lambda v: json.loads(
                        json.dumps(v, allow_nan=False)), value)
            send(("done", value) if ok else ("error", value))
            continue
        _, completions, examples, index, style = message
        values, flushed = [], time.monotonic()
        for completion, i in zip(completions, index):
            ok, value = guarded("reward()", task.reward, completion, examples[i], style=style)
            if ok:
                ok, value = guarded("reward()", tasks.reward_number, value, f"task {task.name}", completion)
            if not ok:
                send(("values", values))
                send(("error", value))
                break
            values.append(value)
            if time.monotonic() - flushed >= FLUSH_S:
                send(("values", values))
                values, flushed = [], time.monotonic()
        else:
            send(("values", values))
            send(("done", None))


def report(error):
    """An exception raised by a task's call, as the trainer rebuilds it (RewardWorker.error): strings only, the
    message cut to SHOWN characters and the traceback to its last 10 x SHOWN."""
    if not isinstance(error, Exception):
        return {"kind": "base", "type": type(error).__name__, "shown": first_argument(error)}
    try:
        message = str(error)[:SHOWN]
    except Exception:  # noqa: BLE001
        message = f"(a {type(error).__name__} whose message cannot be shown)"
    return {"kind": "exception", "type": type(error).__name__, "module": str(type(error).__module__),
            "message": message, "traceback": "".join(traceback.format_exception(
                type(error), error, error.__traceback__))[-10 * SHOWN:]}


def build_task(recipe):
    """The run's task, as settle() built it (tasks.get_task; a task file's protocol was checked there)."""
    name, data, options = recipe["task"], recipe["data"], recipe["options"]
    if name not in tasks.TASKS and tasks.is_task_file(name):
        return tasks.custom.build(name, data=data, **options)
    return tasks.get_task(name, data=data, **options)
