"""Where a task's code runs during a run: a worker process, out of the trainer's reach.

A task's reward() (and a task file's examples() and solution()) is the user's code: it may chdir,
fork, exit or never return. It runs in one worker process, in a scratch folder, below a keeper that
runs no task code (reward_keeper.py): a request goes as a pickle, its answer comes back as JSON
(finite floats, strings; at most MESSAGE_LIMIT bytes), each on --reward-timeout's clock; however the
run ends, the keeper (or end_worker) ends all below it. A task registered from Python (the tests'
stubs) runs in the trainer under SIGALRM (TimedRewards). docs/tasks.md, "What a reward runs inside",
says what each side can reach.
"""
import contextlib
import fcntl
import functools
import json
import math
import os
import pickle
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import weakref

import tasks
from harness.console import say
from harness.files import RunError, open_nofollow, what_is
from harness.reward_keeper import HEADER, POLL_S, first_argument, framed, processes
from harness.stops import Stopped

STOP_GRACE = 5.0  # seconds a reward call under way when a stop signal arrives may still take to return
TIMER_LIMIT = 1e8  # seconds: a longer --reward-timeout is no limit for SIGALRM (setitimer overflows near 1e300)
MESSAGE_LIMIT = 1 << 28  # bytes of one message back
BUILD_S = 120.0  # seconds the worker may take to build the task (a task file's import and make_task()), at least
SCRATCH, BUILT = "reward-worker-", "its import and make_task()"
MARK, LOCK = "REWARD_WORKER_SCRATCH", ".lock"  # the keeper's environment: MARK=<scratch folder>
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RewardTimeout(BaseException):
    """A task's reward() ran past --reward-timeout: start() turns it into one InputError line naming the task (exit
    2). A BaseException, so that a task file's own `except Exception` (or tasks/custom.py's, which reports a bug in
    the file) cannot take it for the reward's own error."""


class RemoteTraceback(Exception):
    """The worker's traceback of an exception raised in a task's call, shown above the trainer's (a bug)."""
    def __str__(self):
        return f"\n\n(in the reward worker process)\n{self.args[0]}"


def timed_task(task, seconds, recipe=None):
    """settle()'s wrap of the task: a RewardWorker where the worker can rebuild it from `recipe` (worker_recipe),
    else TimedRewards in this process, with a note."""
    if recipe is not None and rebuildable(recipe["task"]):
        return RewardWorker(task, seconds, recipe)
    if recipe is not None:
        say(f"note: task {task.name} was registered from Python (tasks.TASKS), so a worker process cannot rebuild it: "
            "its rewards run in this process (harness/reward_worker.py; a reward that changes the working directory, "
            "forks or exits reaches the run)")
    return TimedRewards(task, seconds)


def worker_first(config):
    """settle()'s wrap of the task (timed_task). A task file's worker starts now and builds it before this process
    does: an import or make_task() that blocks is one line after BUILD_S seconds (or --reward-timeout, if longer)."""
    recipe = worker_recipe(config)
    worker = RewardWorker(types.SimpleNamespace(name=recipe["task"]), config.reward_timeout, recipe) \
        if tasks.is_task_file(config.task) else None
    if worker is not None:  # one that fails is said by this process's own build
        try:
            worker.ready = worker.answer(BUILT, lambda k: "", BUILD_S) is not None
        finally:
            worker.ready or worker.close()

    def wrap(task):
        if worker is None:
            return timed_task(task, config.reward_timeout, recipe)
        worker.task = task
        return worker
    wrap.building = functools.partial(second_build, worker) if worker else contextlib.nullcontext
    return wrap


@contextlib.contextmanager
def second_build(worker):
    """Around this process's build of the task file `worker` built first (tasks/custom.py's load):
    past BUILD_S (or --reward-timeout, if longer), or an error where the worker's build succeeded
    (a lock, a port, stdin the first holds), one TaskError naming the file and the second build."""
    limit = min(max(worker.seconds, BUILD_S), TIMER_LIMIT)
    main = threading.current_thread() is threading.main_thread()  # SIGALRM reaches it only

    def expired(signum, frame):
        raise RewardTimeout(f"ran for more than {limit:g} s")
    previous = signal.signal(signal.SIGALRM, expired) if main else None
    main and signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    except (Exception, RewardTimeout) as error:
        if not worker.ready and not isinstance(error, RewardTimeout):
            raise  # the worker's build failed as well: the file's own error, as it is
        happened = str(error) if isinstance(error, RewardTimeout) else \
            f"raised {type(error).__name__} ({(str(error).strip().splitlines() or [''])[0][:200]})"
        raise tasks.TaskError(
            f"{worker.recipe['task']}: {BUILT} {happened} in the trainer: a task file is built "
            "twice, in the reward worker, then in the trainer, so its import takes no lock, port "
            "or stdin that the first build keeps, nor waits long; take them in reward()") from None
    finally:
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def worker_recipe(config):
    """What the worker needs to build the run's task again: the task's name or file, --data,
    --task-option and this process's import path, each path made absolute."""
    task = tasks.custom.source_file(config.task) if config.task.endswith(".py") else config.task
    data = os.path.abspath(config.data) if config.data and os.path.exists(config.data) else config.data
    return dict(task=task, data=data, options=dict(config.task_options),
                sys_path=[os.path.abspath(entry or os.curdir) for entry in sys.path])


def rebuildable(name):
    """Whether a fresh process builds the task `name` as this one did: a task file or module, or a built-in task
    whose factory is still its module's make_task (not one registered from Python)."""
    if name not in tasks.TASKS:
        return tasks.is_task_file(name)
    factory = tasks.TASKS[name]
    module = sys.modules.get(getattr(factory, "__module__", None) or "")
    return module is not None and module.__name__.startswith("tasks.") and getattr(module, "make_task", 0) is factory


class TimedRewards:
    """The task, each reward(), examples() and solution() call under SIGALRM (main thread only):
    past --reward-timeout, or after a stop signal past STOP_GRACE (so Ctrl-C ends a run whose reward
    never returns), one line naming the task. For a task the worker cannot rebuild
    (RewardWorker)."""
    running = False   # a reward call is under way
    stop_signal = 0   # the stop signal received, if any (reset by start())
    stopped_at = 0.0  # when it came (time.monotonic())
    TIMED_CALLS = ("examples", "solution")

    def __init__(self, task, seconds):
        self.task, self.seconds = task, seconds

    def __getattr__(self, name):
        value = getattr(self.task, name)
        if name not in self.TIMED_CALLS or not hasattr(self.task, "source"):  # a task file has its path as source
            return value

        def timed(*args, **kwargs):
            return self.timed(value, f"{name}({shown(args, kwargs)[:80]})", "", *args, **kwargs)
        return timed

    def reward(self, completion, example, **kwargs):
        value = self.timed(self.task.reward, "reward()", f" on the completion {completion[:80]!r}", completion,
                           example, **kwargs)
        return tasks.reward_number(value, f"task {self.task.name}", completion)

    def rewards(self, completions, examples, *, style):
        """reward() of each completion and its example -> list of floats (train.collect_rollouts' one call)."""
        return [self.reward(text, example, style=style) for text, example in zip(completions, examples)]

    def source_note(self):
        return f" ({self.task.source})" if hasattr(self.task, "source") else ""  # a task file: its path

    def timed(self, call, what, detail, *args, **kwargs):
        """call(*args, **kwargs) under the time limit; `what` and `detail` name it in an error ("reward()", " on
        the completion ...")."""
        interrupts = []  # a real Ctrl-C during the call (its KeyboardInterrupt is not the task's)

        def expired(signum, frame):
            if TimedRewards.stop_signal:
                say(stop_grace_line(what, self.task.name))
                raise Stopped(TimedRewards.stop_signal)
            raise RewardTimeout(timeout_line(self.task.name, what, self.seconds, detail, self.source_note()))

        def interrupted(signum, frame):
            interrupts.append(signum)
            if callable(previous_interrupt):  # Python's (a KeyboardInterrupt), or start()'s
                previous_interrupt(signum, frame)
        main = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
        limit = min(self.seconds or STOP_GRACE, STOP_GRACE) if TimedRewards.stop_signal else self.seconds
        if main:
            previous, previous_interrupt = signal.signal(signal.SIGALRM, expired), \
                signal.signal(signal.SIGINT, interrupted)
            if 0 < limit <= TIMER_LIMIT:
                signal.setitimer(signal.ITIMER_REAL, limit)
            TimedRewards.running = True
        try:
            return call(*args, **kwargs)
        except BaseException as error:
            if isinstance(error, (Exception, Stopped, RewardTimeout)) or interrupts:
                raise
            raise tasks.TaskError(base_exception_line(self.task.name, what, type(error).__name__,
                                                      first_argument(error), detail, self.source_note())) from None
        finally:
            if main:
                TimedRewards.running = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                signal.signal(signal.SIGINT, previous_interrupt)

    @staticmethod
    def stop(signum):
        """A stop signal: the reward call under way, and each one after it, gets STOP_GRACE seconds."""
        TimedRewards.stop_signal, TimedRewards.stopped_at = signum, time.monotonic()
        if TimedRewards.running:
            signal.setitimer(signal.ITIMER_REAL, STOP_GRACE)


def shown(args, kwargs):
    return ", ".join([*map(repr, args), *(f"{key}={item!r}" for key, item in kwargs.items())])


def timeout_line(name, what, seconds, detail, source):
    return f"task {name}: {what} ran for more than {seconds:g} s{detail}; fix the task{source}, or raise " \
        "--reward-timeout"


def stop_grace_line(what, name):
    return f"a {what} call of task {name} did not return within {STOP_GRACE:g} s of the stop signal: the run ends " \
        "now, nothing of this step saved"


def base_exception_line(name, what, kind, shown, detail, source):
    return (f"task {name}: {what} raised {kind}{shown}{detail}, which would end the run without a word; a task "
            f"returns, or raises an Exception for a bug{source}")


# ---------------------------------------------------------------------------------------------------------------
# The worker, seen from the trainer
# ---------------------------------------------------------------------------------------------------------------
class RewardWorker(TimedRewards):
    """The task, its reward() (a task file's examples() and solution() too) called in the worker process: the
    module docstring. Everything else (name, prompt(), pass_threshold, ...) is the task built in this process."""

    def __init__(self, task, seconds, recipe):
        super().__init__(task, seconds)
        self.recipe, self.process = recipe, None
        self.remote = ("reward",) + (self.TIMED_CALLS if tasks.is_task_file(recipe["task"]) else ())
        self.start()  # now: its start overlaps the model's loading

    def __getattr__(self, name):
        value = getattr(self.task, name)
        if name not in self.remote:
            return value

        def remote(*args, **kwargs):
            return self.ask(("call", name, args, kwargs), f"{name}({shown(args, kwargs)[:80]})", lambda k: "")
        return remote

    def reward(self, completion, example, **kwargs):
        return self.ask(("call", "reward", (completion, example), kwargs), "reward()",
                        lambda k: f" on the completion {completion[:80]!r}")

    def rewards(self, completions, examples, *, style):
        """The rewards of a batch in one round trip -> list of floats, in the order of completions."""
        where = {}  # a prompt's M completions share its example: each is sent once
        index = [where.setdefault(id(example), len(where)) for example in examples]
        unique = list({id(example): example for example in examples}.values())
        return self.ask(("rewards", completions, unique, index, style), "reward()",
                        lambda k: f" on the completion {completions[k][:80]!r}", len(completions))

    def start(self):
        """The keeper (keep): a fresh interpreter (no fork of this process), in a scratch folder
        whose LOCK this process holds; it and all below it inherit MARK=<scratch> (end_worker)."""
        remove_dead_scratch()
        self.scratch = tempfile.mkdtemp(prefix=f"{SCRATCH}{os.getpid()}-")
        lock = os.open(os.path.join(self.scratch, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel however this process ends
        requests_read, self.requests = os.pipe()
        self.results, results_write = os.pipe()
        os.set_blocking(self.requests, False)  # written as it drains, on the clock (read_record)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-u", "-c", f"import sys; sys.path[0] = {REPOSITORY!r}; from "
                 f"harness.reward_keeper import keep; keep({requests_read}, {results_write}, "
                 f"{os.getpid()}, {self.scratch!r})"], cwd=self.scratch, stdin=subprocess.DEVNULL,
                pass_fds=(requests_read, results_write), start_new_session=True,
                env={**os.environ, MARK: self.scratch})
        finally:
            os.close(requests_read)
            os.close(results_write)
        self.closed = weakref.finalize(self, end_worker, self.process,
                                       (self.requests, self.results, lock), self.scratch)
        self.buffer, self.turn, self.ready = bytearray(), 0, False  # turn: 0 the recipe, 1, 2, ...
        self.pending, self.sent = framed(pickle.dumps(self.recipe)), 0  # to send; how much went

    def close(self):
        self.closed()
        self.process = None

    def ask(self, message, what, detail, count=None):
        """Send one request and read its answer (answer); any error ends the worker (a later call
        starts another)."""
        if self.process is None:
            self.start()
        try:
            if not self.ready:
                self.answer("the task's build in the worker", lambda k: "", BUILD_S)
                self.ready = True
            self.pending, self.sent, self.turn = framed(pickle.dumps(message)), 0, self.turn + 1
            return self.answer(what, detail, count=count)
        except BaseException:
            self.close()
            raise

    def answer(self, what, detail, least=0.0, count=None):
        """The answer to the pending request (sent meanwhile): a call's value, or a batch's `count`
        rewards; the time limit runs from the request and from each reward read back."""
        limit = max(self.seconds, least) if self.seconds > 0 else least or float("inf")
        progress, values = time.monotonic(), []  # the request sent, or the latest reward read back
        while True:
            deadline = progress + limit
            grace = max(progress, TimedRewards.stopped_at) + STOP_GRACE if TimedRewards.stop_signal else deadline
            remaining = min(deadline, grace) - time.monotonic()
            if remaining <= 0:
                if grace < deadline:
                    say(stop_grace_line(what, self.task.name))
                    raise Stopped(TimedRewards.stop_signal)
                raise RewardTimeout(timeout_line(self.task.name, what, limit, detail(len(values)),
                                                 self.source_note()))
            record = self.read_record(min(remaining, POLL_S), what)
            if record is None:
                continue
            if record is EOFError:
                raise tasks.TaskError(self.ended_line(what, detail(len(values))))
            kind, payload = record
            if kind == "values" and count is not None and len(values) + len(payload) <= count:
                values += payload
                progress = time.monotonic()
            elif kind == "done" and (count is None or payload is None and len(values) == count):
                return payload if count is None and payload is not None else values
            elif kind == "error":  # a task's error, raised here; then the worker is ended (ask)
                if what == BUILT:  # the worker's build of a task file failed: ours says how
                    return None
                raise self.error(payload, what, detail(len(values)))
            else:
                raise tasks.TaskError(self.protocol_line(
                    what, f"{kind!r} with {len(values)} of {count} rewards"))

    def read_record(self, seconds, what):
        """The next message back (JSON), None if none is whole after one wait of at most `seconds`
        (writing what the channel takes of the request meanwhile), EOFError once the worker's
        channel closed or its keeper exited."""
        size = HEADER.unpack_from(self.buffer)[0] if len(self.buffer) >= HEADER.size else 0
        if len(self.buffer) < HEADER.size + size:
            ready = select.poll()
            ready.register(self.results, select.POLLIN)
            if self.sent < len(self.pending):
                ready.register(self.requests, select.POLLOUT)
            events = dict(ready.poll(seconds * 1000))
            if events.get(self.requests):
                try:
                    self.sent += os.write(self.requests, memoryview(self.pending)[self.sent:])
                except BrokenPipeError:
                    return EOFError
            if events.get(self.results):
                chunk = os.read(self.results, 1 << 20)
                if not chunk:
                    return EOFError
                self.buffer += chunk
            elif not events and self.process.poll() is not None:  # gone, whoever holds the channel
                return EOFError
            size = HEADER.unpack_from(self.buffer)[0] if len(self.buffer) >= HEADER.size else 0
        if size > MESSAGE_LIMIT:
            raise tasks.TaskError(self.protocol_line(what, f"a message of {size} bytes, over {MESSAGE_LIMIT}"))
        if len(self.buffer) < HEADER.size + size or not size:
            return None
        data = bytes(self.buffer[HEADER.size:HEADER.size + size])
        del self.buffer[:HEADER.size + size]
        try:
            turn, kind, payload = json.loads(data, parse_constant=finite, parse_float=finite)
        except (ValueError, TypeError, RecursionError) as error:
            raise tasks.TaskError(self.protocol_line(what, f"{type(error).__name__}: {str(error)[:80]}")) from None
        if turn != self.turn or kind not in ("values", "done", "error") or kind == "values" and \
                not (isinstance(payload, list) and all(isinstance(v, float) for v in payload)) or \
                kind == "error" and not (isinstance(payload, dict) and all(
                    isinstance(value, str) for value in payload.values())):
            raise tasks.TaskError(self.protocol_line(what, f"to request {str(turn)[:20]}, not "
                                                           f"{self.turn}: {str(kind)[:20]!r} with "
                                                           f"{str(payload)[:40]!r}"))
        return kind, payload

    def ended_line(self, what, detail):
        """What ended the worker, one line: the task's call, or the keeper killed from outside."""
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:  # the keeper itself, which runs no task code, was killed
            return (f"task {self.task.name}: the reward worker's keeper process {self.process.pid} "
                    f"was killed by {signal.Signals(-code).name} during a {what} call{detail}, "
                    "from outside the run; the worker and all it started were ended with it")
        killed = code is not None and code - 128 in signal.valid_signals()  # 128 + N: by signal N
        ended = "closed its channel to the trainer" if code is None else \
            f"was killed by {signal.Signals(code - 128).name}" if killed else \
            f"exited with code {code}"
        return (f"task {self.task.name}: the reward worker process {ended} during a {what} call{detail}: a task's "
                f"call returns a value (or raises an Exception for a bug), never ends its process{self.source_note()}")

    def protocol_line(self, what, found):
        return (f"task {self.task.name}: during a {what} call the reward worker sent what is no message of its own "
                f"({found}): a task's code writes nothing into the worker's channel to the trainer{self.source_note()}")

    def error(self, payload, what, detail):
        """The exception to raise here for the worker's report of one (strings only: read_record)."""
        name, source, get = self.task.name, self.source_note(), lambda key: payload.get(key, "")
        if get("kind") == "base":  # SystemExit, KeyboardInterrupt, ... : they would end a run silently
            return tasks.TaskError(base_exception_line(name, what, get("type"), get("shown"), detail, source))
        if get("kind") == "forked":
            return tasks.TaskError(f"task {name}: a {get('what')} call forked the process and the child returned "
                                   f"from it; the child ended there. A task that forks ends its children itself "
                                   f"(os._exit), or runs a program with subprocess{source}")
        import builtins
        cls = {"tasks.custom": vars(tasks.custom), "builtins": vars(builtins)}.get(get("module"), {}).get(get("type"))
        if cls is tasks.TaskError:  # what the task got wrong, one line: its message says which and where
            return cls(get("message"))
        try:  # anything else is a bug: this process's traceback, the worker's above it
            error = cls(get("message")) if isinstance(cls, type) and issubclass(cls, Exception) else None
        except Exception:  # an exception class that takes other arguments
            error = None
        error = error or RuntimeError(f"{get('module')}.{get('type')}: {get('message')}")
        error.__cause__ = RemoteTraceback(get("traceback"))
        return error


def end_worker(process, descriptors, scratch):
    """The keeper told to end (it kills the worker and all below it); for one stopped or stuck for
    10 s, or killed, every process marked as this worker's (MARK, whatever its session) is killed
    here. Then the pipes and the lock closed, the scratch folder gone."""
    with contextlib.suppress(ProcessLookupError):
        process.poll() is None and os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        kill_marked(scratch)
        process.wait()
    kill_marked(scratch)  # nothing, unless the keeper was killed before it could end them
    for fd in descriptors:
        os.close(fd)
    shutil.rmtree(scratch, ignore_errors=True)


def kill_marked(scratch):
    """SIGKILL each process of this user whose environment holds MARK=scratch, until none is left
    (100 rounds at most: one stuck in the kernel stays)."""
    mark = f"{MARK}={scratch}".encode()
    for _ in range(100):
        found = processes("environ", lambda environ: mark in environ.split(b"\0"))
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not found:
            return
        time.sleep(0.01)


def remove_dead_scratch():
    """Remove this user's scratch folders whose trainer is gone, wherever its PID lives (a container
    sharing this tempdir): those whose LOCK, which a live trainer holds, this process can take."""
    folder = tempfile.gettempdir()
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if not re.fullmatch(re.escape(SCRATCH) + r"\d+-\w+", name) or what_is(path) != "a directory" \
                or os.stat(path).st_uid != os.getuid():
            continue
        with contextlib.suppress(OSError, RunError):  # no LOCK (a run starting), or held: it stays
            fd = open_nofollow(os.path.join(path, LOCK), os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(path, ignore_errors=True)
            finally:
                os.close(fd)


def finite(text):
    """JSON's number `text` (NaN, Infinity, 1e999 too) as a float: a ValueError unless finite."""
    if not math.isfinite(float(text)):
        raise ValueError(f"{text[:20]} is no finite number")
    return float(text)
