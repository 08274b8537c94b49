"""A task's reward runs in a worker process (harness/reward_worker.py): what it does there cannot move, replace or
stop the run's files, fork or hang the trainer, end the run without a word (issue 69), or outlive the run (issue
75); and a run's rewards are the same numbers, in the same order, as in the trainer's own process.

The runs whose reward forks or never returns are subprocesses in a session of their own, under a process limit
(RLIMIT_NPROC, which a root user is not held to: the task files' own fork budget bounds them there too) and a
timeout; every process they leave is found by an environment marker and killed."""
import json
import os
import random
import resource
import signal
import subprocess
import sys
import textwrap
import time
import types
import uuid

import pytest

from harness import checkpoint, reward_worker as rewards
import tasks
import train
from tests.stubs import SMALL_TRAIN as SMALL, DigitsTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("one_thread")

# probe 2 rewards + step-0 eval 4 + step 1: 8 = 14 calls: from the 15th on (step 2) the task misbehaves
TASK = """
import os, random, signal, sys, time

class Digits:
    def __init__(self, misbehave):
        self.calls, self.misbehave = 0, misbehave

    def examples(self, split, n, seed):
        rng = random.Random(f"{split}-{seed}")
        return [{"prompt": f"{rng.randint(0, 99)}>"} for _ in range(n)]

    def reward(self, completion, example, style="chat"):
        self.calls += 1
        if self.calls > AFTER:
            self.misbehave()
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)

def make_task(data=None):
    return Digits(MISBEHAVE)
"""


def task_file(tmp_path, misbehave, after=14, name="my_task.py"):
    """A task file whose reward calls `misbehave` (the body of a function of no arguments) after `after` calls."""
    body = "def misbehave():\n" + textwrap.indent(textwrap.dedent(misbehave).strip(), "    ") + "\n"
    path = tmp_path / name
    path.write_text(body + textwrap.dedent(TASK).replace("AFTER", str(after)).replace("MISBEHAVE", "misbehave"))
    return str(path)


def processes_with(marker):
    """The pids of the processes whose environment holds MARKER=marker (a run and everything it started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"REWARD_WORKER_TEST={marker}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def limited():
    """In the child before it runs train.py: at most 64 processes more than this user has (RLIMIT_NPROC)."""
    mine = sum(1 for pid in os.listdir("/proc") if pid.isdigit() and os.path.exists(f"/proc/{pid}")
               and os.stat(f"/proc/{pid}").st_uid == os.getuid())
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    soft = mine + 64 if hard == resource.RLIM_INFINITY else min(hard, mine + 64)
    resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))


def run_train(args, cwd, timeout=150, signals=()):
    """train.py args in cwd, in a session of its own, limited (limited()) and timed, its temporary files in
    cwd/tmp; `signals`: (file, signal, ...): once the file exists, the signals are sent to it -> (returncode,
    stdout, stderr, the pids still marked once it ended: killed here)."""
    marker = uuid.uuid4().hex
    os.makedirs(os.path.join(cwd, "tmp"), exist_ok=True)
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=limited, env={**os.environ, "REWARD_WORKER_TEST": marker,
                                                     "TMPDIR": os.path.join(cwd, "tmp")})
    if signals:
        deadline = time.time() + timeout
        while not os.path.exists(signals[0]) and time.time() < deadline:
            time.sleep(0.1)
        for signum in signals[1:]:
            time.sleep(0.5)
            proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(the test killed it: still running after {timeout} s)"
    time.sleep(2)  # what the run killed as it ended is reaped by then
    left = processes_with(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err, left


def last_line(err):
    return err.strip().splitlines()[-1] if err.strip() else ""


def metrics_rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [{key: value for key, value in json.loads(line).items() if key not in ("rollout_s", "update_s",
                                                                                      "tokens_per_s")} for line in f]


# --- a reward cannot move or replace the run's files, nor change the trainer's state ---------------------------------
MEDDLES = """
import torch
if os.path.isdir("run"):  # the run's folder, seen from the trainer's working directory
    with open(os.path.join("run", "metrics.jsonl"), "w") as f:
        f.write("clobbered")
os.chdir(ELSEWHERE)
torch.manual_seed(1234)
random.seed(5)
torch.set_num_threads(3)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.path.insert(0, ELSEWHERE)
sys.stdout.close()
"""


def test_a_reward_that_moves_writes_and_changes_global_state_leaves_the_run_as_it_was(tmp_path):
    # f80a5bd: os.chdir moved the lock, checkpoints, latest and metrics under the new directory (exit 0); the
    # reward's torch.manual_seed changed the run's samples; closing stdout ended it in a traceback
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = task_file(tmp_path / "a", "pass")
    meddling = task_file(tmp_path / "b", MEDDLES.replace("ELSEWHERE", repr(str(elsewhere))), after=0)
    flags = ["--output-dir", "run", *SMALL, "--steps", "3", "--save-every", "1"]
    code, _, err, _ = run_train(["--task", plain, *flags], cwd=tmp_path / "a")
    assert code == 0, err
    code, _, err, _ = run_train(["--task", meddling, *flags], cwd=tmp_path / "b")
    assert code == 0, err
    assert os.listdir(elsewhere) == []  # nothing of the run's moved there
    out = str(tmp_path / "b" / "run")
    assert checkpoint.checkpoint_steps(out) == [2, 3] and os.path.exists(os.path.join(out, "latest"))
    assert metrics_rows(out) == metrics_rows(str(tmp_path / "a" / "run"))  # same rewards, same samples


# --- a reward that forks, never returns or ends its process: one line, the files intact ---------------------------
FORKS = """
for n in range({budget}):  # at most this many forks in all, whatever runs this code (f80a5bd: the run itself)
    try:
        os.close(os.open(os.path.join({folder!r}, "fork-" + str(n)), os.O_CREAT | os.O_EXCL))
        break
    except FileExistsError:
        continue
else:
    return
os.fork()  # the child returns too
"""


def test_a_reward_that_forks_never_forks_the_trainer(tmp_path):
    # f80a5bd: each child re-entered the training loop and forked again (hundreds of processes)
    path = task_file(tmp_path, FORKS.format(budget=8, folder=str(tmp_path)))
    code, out, err, left = run_train(["--task", path, "--output-dir", "run", *SMALL, "--steps", "4",
                                      "--save-every", "1"], cwd=tmp_path)
    assert code == 2 and "Traceback" not in err and not left, (code, err, left)
    assert last_line(err).startswith("train.py: error: task my_task: a reward() call forked the process and the "
                                     "child returned from it"), err
    assert checkpoint.checkpoint_steps(str(tmp_path / "run")) == [1]
    assert out.count("step 0: held-out pass@1") == 1  # one trainer, one loop


HANGS = {
    "a bare except": "while True:\n    try:\n        time.sleep(100)\n    except BaseException:\n        pass",
    "an ignored SIGALRM": "signal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",
    "a reset timer": "while True:\n    signal.setitimer(signal.ITIMER_REAL, 0)\n    time.sleep(0.01)",
}


CHECK_TASK = """
import functools, sys, types
sys.path.insert(0, {repo!r})
import tasks
from harness import reward_worker as rewards
config = types.SimpleNamespace(task={path!r}, data=None, task_options={{}})
try:
    tasks.get_task({path!r}, wrap=functools.partial(rewards.timed_task, seconds=1,
                                                    recipe=rewards.worker_recipe(config)))
except rewards.RewardTimeout as error:
    print(error)
"""


@pytest.mark.parametrize("hang", list(HANGS))
def test_a_hang_that_defeats_an_alarm_is_stopped_by_the_time_limit(tmp_path, hang):
    # f80a5bd: each of these hung the run past --reward-timeout (forever). Here: the rewards that check the task
    # file as it is built, as settle() builds it, in a process without torch (seconds); the whole run's case is the
    # next test, and tests/test_task_file.py's hangs
    path = task_file(tmp_path, HANGS[hang], after=0)
    marker = uuid.uuid4().hex
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-c", CHECK_TASK.format(repo=REPO, path=path)], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=limited, env={**os.environ, "REWARD_WORKER_TEST": marker})
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    time.sleep(0.5)
    left = processes_with(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0 and not left, (proc.returncode, err, left)
    assert out.startswith("task my_task: reward() ran for more than 1 s on the completion ''"), (out, err)
    assert time.time() - started < 30


@pytest.mark.slow  # the three hangs above, as the task is checked, are the default suite's
def test_a_hang_in_a_run_stops_it_in_one_line_with_its_files_intact(tmp_path):
    path = task_file(tmp_path, HANGS["a bare except"])
    code, _, err, left = run_train(["--task", path, "--output-dir", "run", *SMALL, "--steps", "4", "--save-every",
                                    "1", "--reward-timeout", "2"], cwd=tmp_path)
    assert code == 2 and "Traceback" not in err and not left, (code, err, left)
    assert last_line(err).startswith("train.py: error: task my_task: reward() ran for more than 2 s on the "
                                     "completion"), err
    assert checkpoint.checkpoint_steps(str(tmp_path / "run")) == [1]
    assert [row["step"] for row in metrics_rows(str(tmp_path / "run"))] == [0, 1]


@pytest.mark.parametrize("exit_code,in_run", [(0, True), (3, False)], ids=["0 in step 2", "3 as the task is checked"])
def test_a_reward_that_ends_its_process_is_one_line_naming_the_task(tmp_path, exit_code, in_run):
    # f80a5bd: os._exit(0) or os._exit(3) in a reward ended the run with that code and no message
    path = task_file(tmp_path, f"os._exit({exit_code})", after=14 if in_run else 0)
    code, _, err, left = run_train(["--task", path, "--output-dir", "run", *SMALL, "--steps", "4", "--save-every",
                                    "1"] + ([] if in_run else ["--dry-run"]), cwd=tmp_path)
    assert code == 2 and "Traceback" not in err and not left, (code, err, left)
    assert last_line(err).startswith(f"train.py: error: task my_task: the reward worker process exited with code "
                                     f"{exit_code} during a reward() call on the completion"), err
    if in_run:
        assert checkpoint.checkpoint_steps(str(tmp_path / "run")) == [1]


def test_a_float_whose_conversion_raises_is_one_line_naming_the_task(tmp_path, capsys):
    # f80a5bd: a float subclass whose __float__ raises ended the run in that exception's traceback
    path = tmp_path / "my_task.py"
    path.write_text(textwrap.dedent("""
        class Odd(float):
            def __float__(self):
                raise RuntimeError("no float here")

        class Task:
            def examples(self, split, n, seed):
                return [{"prompt": "1>"} for _ in range(n)]

            def reward(self, completion, example, style="chat"):
                return Odd(0.5)

        def make_task(data=None):
            return Task()
    """))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--task", str(path), "--dry-run", *SMALL])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    assert f"{path}: reward() returned 0.5 (Odd) (float() of it raised RuntimeError) for the completion ''" in err


# --- the limit's values, the fallback, and the rewards themselves --------------------------------------------------
@pytest.mark.parametrize("task", ["countdown", "digits"])
def test_a_huge_reward_timeout_is_no_limit(tmp_path, digits_task, task):
    # f80a5bd: --reward-timeout 1e300 passed --dry-run, then the first reward raised OverflowError (setitimer)
    result = train.main(["--task", task, "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1",
                         "--reward-timeout", "1e300"])
    assert result["after"] is not None


def test_a_task_registered_from_python_keeps_its_rewards_here_and_says_so(tmp_path, digits_task, capsys):
    calls = []
    tasks.TASKS["digits"] = lambda data=None: DigitsTask(on_reward=lambda: calls.append(os.getpid()))
    train.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1"])
    assert "note: task digits was registered from Python (tasks.TASKS), so a worker process cannot rebuild it: its " \
        "rewards run in this process" in capsys.readouterr().out
    assert calls and set(calls) == {os.getpid()}


def test_the_workers_rewards_are_the_tasks_own_in_order():
    config = types.SimpleNamespace(task="countdown", data=None, task_options={"num_count": 2})
    task = tasks.get_task("countdown", num_count=2)
    timed = tasks.get_task("countdown", num_count=2, wrap=lambda made: rewards.timed_task(
        made, 60.0, rewards.worker_recipe(config)))
    assert isinstance(timed, rewards.RewardWorker)
    examples = task.examples("train", 16, seed=3)
    rng = random.Random(0)
    completions, scored = [], []
    for example in examples:  # the solution, a near miss, and noise: rewards 1, 0 and the format's
        solution = task.solution(example, "compact")
        for text in (solution, solution.replace("+", "-"), "".join(rng.choice("0123456789+-*/ ") for _ in range(6))):
            completions.append(text)
            scored.append(example)
    expected = [float(task.reward(text, example, style="compact")) for text, example in zip(completions, scored)]
    assert timed.rewards(completions, scored, style="compact") == expected
    assert [timed.reward(text, example, style="compact") for text, example in zip(completions, scored)] == expected
    assert 0 < sum(expected) < len(expected)
    worker, scratch = timed.process.pid, timed.scratch
    timed.close()  # its process group killed and reaped, its scratch directory gone
    assert not os.path.exists(f"/proc/{worker}") and not os.path.exists(scratch)


def test_after_a_stop_signal_a_step_whose_rewards_return_still_gets_them(monkeypatch):
    # Ctrl-C during the step's rollouts: its rewards, asked for long after the signal, come back (each call has
    # STOP_GRACE from when it is asked), so the step finishes and saves
    task = tasks.get_task("countdown", num_count=2)
    config = types.SimpleNamespace(task="countdown", data=None, task_options={"num_count": 2})
    timed = rewards.timed_task(task, 60.0, rewards.worker_recipe(config))
    examples = task.examples("train", 4, seed=0)
    monkeypatch.setattr(rewards.TimedRewards, "stop_signal", signal.SIGINT)
    monkeypatch.setattr(rewards.TimedRewards, "stopped_at", time.monotonic() - 10 * rewards.STOP_GRACE)
    completions = [task.solution(example, "compact") for example in examples]
    assert timed.rewards(completions, examples, style="compact") == [1.0] * 4
    timed.close()


# --- nothing a reward starts outlives the run, however it ends (issue 75) --------------------------------------------
STARTS = """
if not os.path.exists("{flag}"):  # once: a program in a session of its own, out of any process group's reach
    import subprocess
    subprocess.Popen(["sleep", "300"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open("{flag}", "w").close()
{then}
"""


@pytest.mark.parametrize("ending", ["clean", "SIGKILL", "a second SIGTERM"])
def test_nothing_a_reward_starts_outlives_the_run(tmp_path, ending):
    # 2c9f269: the setsid child ran on under init after each ending, and a SIGKILL left the scratch folder behind
    flag = str(tmp_path / "started")
    path = task_file(tmp_path, STARTS.format(flag=flag, then="" if ending == "clean" else "time.sleep(1000)"))
    signals = {"clean": (), "SIGKILL": (flag, signal.SIGKILL), "a second SIGTERM": (flag, signal.SIGTERM,
                                                                                     signal.SIGTERM)}[ending]
    code, _, err, left = run_train(["--task", path, "--output-dir", "run", *SMALL, "--steps", "2",
                                    "--reward-timeout", "0"], cwd=tmp_path, timeout=120, signals=signals)
    assert code == {"clean": 0, "SIGKILL": -9, "a second SIGTERM": -15}[ending], err
    assert os.path.exists(flag) and not left, left
    assert os.listdir(tmp_path / "tmp") == []  # no scratch folder stays


def test_a_scratch_folder_a_killed_run_left_is_removed_at_the_next_start(tmp_path, monkeypatch):
    gone = subprocess.Popen(["true"])
    gone.wait()  # a PID no process has
    monkeypatch.setattr(rewards.tempfile, "tempdir", str(tmp_path))
    for name in (f"reward-worker-{gone.pid}-abc", f"reward-worker-{os.getpid()}-abc", "reward-worker-x"):
        (tmp_path / name).mkdir()
    (tmp_path / f"reward-worker-{gone.pid}-abc" / rewards.LOCK).touch()  # its lock, free
    config = types.SimpleNamespace(task="countdown", data=None, task_options={"num_count": 2})
    timed = rewards.timed_task(tasks.get_task("countdown", num_count=2), 60.0, rewards.worker_recipe(config))
    assert f"reward-worker-{gone.pid}-abc" not in os.listdir(tmp_path)  # 2c9f269: it stayed
    assert {f"reward-worker-{os.getpid()}-abc", "reward-worker-x"} <= set(os.listdir(tmp_path))  # not a dead run's
    timed.close()


# --- a dead worker is seen; only floats and strings cross from it (issue 75) ----------------------------------------
@pytest.mark.parametrize("holder", ["os.system('sleep 300 &')", "os.fork() or time.sleep(300)"])
def test_a_worker_that_exits_is_seen_whatever_holds_its_channel(tmp_path, holder):
    # 2c9f269: the background program kept the result pipe open: with no limit the run hung (the test's timeout)
    path = task_file(tmp_path, f"{holder}\nos._exit(0)")
    code, _, err, left = run_train(["--task", path, "--output-dir", "run", *SMALL, "--steps", "4",
                                    "--reward-timeout", "0"], cwd=tmp_path, timeout=90)
    assert code == 2 and not left and last_line(err).startswith(
        "train.py: error: task my_task: the reward worker process exited with code 0 during a reward() call"), err


def test_what_a_reward_raises_is_never_unpickled_by_the_trainer(tmp_path):
    # 2c9f269 pickled a BaseException's argument and unpickled it in the trainer: this one opened a file there
    opened = tmp_path / "opened-by-the-trainer"
    path = task_file(tmp_path, f"""
        class Opens:
            def __reduce__(self):
                return (open, ({str(opened)!r}, "w"))
        raise SystemExit(Opens())""", after=0)
    code, _, err, _ = run_train(["--task", path, "--dry-run", *SMALL], cwd=tmp_path, timeout=90)
    assert code == 2 and last_line(err).startswith("train.py: error: task my_task: reward() raised SystemExit(<"), err
    assert not opened.exists()


def test_a_huge_exception_message_is_cut_and_a_huge_message_refused(tmp_path):
    # 2c9f269 read and printed all 50 MB of it
    path = task_file(tmp_path, "raise ValueError('x' * 50_000_000)", after=0)
    code, _, err, _ = run_train(["--task", path, "--dry-run", *SMALL], cwd=tmp_path, timeout=90)
    assert code == 1 and "(in the reward worker process)" in err and len(err) < 200_000, (code, len(err))
    claims = "import stat, struct\nfor fd in range(3, 64):\n    try:\n        if stat.S_ISFIFO(os.fstat(fd).st_mode):" \
        "\n            os.write(fd, struct.pack('>Q', 1 << 40))\n    except OSError:\n        pass\ntime.sleep(300)"
    path = task_file(tmp_path, claims, after=0, name="claims.py")
    code, _, err, left = run_train(["--task", path, "--dry-run", *SMALL, "--reward-timeout", "0"], cwd=tmp_path,
                                   timeout=90)
    assert code == 2 and not left and "the reward worker sent what is no message of its own (a message of " \
        f"{1 << 40} bytes" in last_line(err), err


# --- the keeper cannot crash, and whatever ends it, all below it ends (issue 81) -------------------------------------
KEEPER = """
import os, signal, sys
from harness import reward_keeper
reaped = os.waitpid

def waitpid(pid, options):  # the trainer's SIGTERM arrives just after the worker was reaped
    found = reaped(pid, options)
    if found[0]:
        os.kill(os.getpid(), signal.SIGTERM)
    return found
os.waitpid = waitpid
requests, trainer_end = os.pipe()
os.close(trainer_end)  # the trainer gone: the worker reads EOF and exits 0
reward_keeper.keep(requests, os.pipe()[1], os.getppid(), sys.argv[1])
"""


def test_a_sigterm_just_after_the_worker_was_reaped_is_no_crash(tmp_path):
    # 381f0cf: os.kill(worker) raised ProcessLookupError, a traceback, and the scratch folder stayed
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    keeper = subprocess.run([sys.executable, "-c", KEEPER, str(scratch)], cwd=REPO, capture_output=True,
                            text=True, timeout=30)
    assert (keeper.returncode, keeper.stderr) == (0, "") and not scratch.exists()


def worker_of(path, seconds=60.0):
    """A RewardWorker of the task file at path, built."""
    config = types.SimpleNamespace(task=path, data=None, task_options={})
    worker = rewards.RewardWorker(types.SimpleNamespace(name="my_task", source=path), seconds,
                                  rewards.worker_recipe(config))
    worker.answer(rewards.BUILT, lambda k: "", rewards.BUILD_S)
    worker.ready = True
    return worker


def running(pid):
    """Whether pid is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_a_killed_keeper_is_named_and_nothing_below_it_lives_on(tmp_path):
    # 381f0cf: the reward's children lived on under init, and the line blamed the worker and the task
    pids = tmp_path / "pids"
    path = task_file(tmp_path, f"""
        import subprocess
        kids = [subprocess.Popen(["sleep", "300"], start_new_session=new) for new in (False, True)]
        open({str(pids)!r}, "w").write(" ".join(str(kid.pid) for kid in kids))""", after=0)
    worker = worker_of(path)
    assert worker.rewards(["1"], [{"prompt": "1>"}], style="chat") == [1.0]
    kids = [int(pid) for pid in pids.read_text().split()]
    os.kill(worker.process.pid, signal.SIGKILL)
    with pytest.raises(tasks.TaskError, match=f"the reward worker's keeper process {worker.process.pid} was "
                                              "killed by SIGKILL during a reward"):
        worker.rewards(["1"], [{"prompt": "1>"}], style="chat")
    assert not [pid for pid in kids if running(pid)]


def test_a_sweep_removes_no_scratch_folder_whose_lock_is_held(tmp_path, monkeypatch):
    # 381f0cf removed each folder whose PID was not alive here: a live run in another PID namespace lost its own
    import fcntl
    gone = subprocess.Popen(["true"])
    gone.wait()  # a PID no process has here
    monkeypatch.setattr(rewards.tempfile, "tempdir", str(tmp_path))
    locks = {}
    for name in ("held", "free"):
        (tmp_path / f"reward-worker-{gone.pid}-{name}").mkdir()
        locks[name] = os.open(tmp_path / f"reward-worker-{gone.pid}-{name}" / rewards.LOCK, os.O_CREAT | os.O_RDWR)
    fcntl.flock(locks["held"], fcntl.LOCK_EX)  # as the live run's trainer holds it
    rewards.remove_dead_scratch()
    assert os.listdir(tmp_path) == [f"reward-worker-{gone.pid}-held"]
    for fd in locks.values():
        os.close(fd)


# --- every write to the worker is on the clock; the channel takes only the worker's own answers ----------------------
def stopped(worker):
    """worker, its worker process stopped (SIGSTOP): it reads nothing more."""
    [pid] = rewards.processes("stat", lambda stat: int(stat.rsplit(b")", 1)[1].split()[1]) == worker.process.pid)
    os.kill(pid, signal.SIGSTOP)
    return worker


@pytest.mark.parametrize("ending", ["the reward timeout", "a stop signal"])
def test_a_request_the_worker_never_reads_ends_on_the_clock(tmp_path, monkeypatch, ending):
    # 381f0cf wrote the request with a blocking os.write: stuck for good, and the first Ctrl-C did nothing
    monkeypatch.setattr(rewards, "STOP_GRACE", 0.5)
    path = task_file(tmp_path, "pass", after=10**9)
    worker = stopped(worker_of(path, seconds=1.0 if ending == "the reward timeout" else 0))
    if ending == "a stop signal":
        monkeypatch.setattr(rewards.TimedRewards, "stop_signal", signal.SIGINT)
        monkeypatch.setattr(rewards.TimedRewards, "stopped_at", time.monotonic())
    start = time.monotonic()
    with pytest.raises((rewards.RewardTimeout, rewards.Stopped)):
        worker.rewards(["x" * 4_000_000], [{"prompt": "1>"}], style="chat")  # far more than a pipe holds
    assert time.monotonic() - start < 5 and worker.process is None


FORGES = {"a nan": '[1, "values", [NaN]]', "a reward too many": '[1, "values", [1.0, 1.0]]',
          "a reply to another request": '[0, "done", null]', "a batch done early": '[1, "done", null]'}


@pytest.mark.parametrize("forged", list(FORGES))
def test_the_channel_takes_no_message_but_the_workers_answer(tmp_path, forged):
    # 381f0cf took the reward's own ["values", [NaN]]: a ValueError traceback, and the channel out of step
    path = task_file(tmp_path, f"""
        import stat, struct
        data = {FORGES[forged]!r}.encode()
        for fd in range(3, 64):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, struct.pack('>Q', len(data)) + data)
            except OSError:
                pass""", after=0)
    worker = worker_of(path)
    with pytest.raises(tasks.TaskError, match="the reward worker sent what is no message of its own"):
        worker.rewards(["1"], [{"prompt": "1>"}], style="chat")


# --- a task file's second build, in the trainer, is bounded and named ------------------------------------------------
HOLDS = {"a lock": "import fcntl\nheld = open(__file__ + '.lock', 'w')\nfcntl.flock(held, fcntl.LOCK_EX)\n",
         "a port": "import socket\nheld = socket.socket()\nheld.bind(('127.0.0.1', PORT))\n"}


@pytest.mark.parametrize("hold", list(HOLDS))
def test_what_a_task_file_holds_at_import_is_one_line_naming_the_second_build(tmp_path, monkeypatch, hold):
    # 381f0cf: the trainer's import waited for the worker's lock for good; a port was "Address already in use"
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = task_file(tmp_path, "pass")
    (tmp_path / "my_task.py").write_text(HOLDS[hold].replace("PORT", str(port)) + open(path).read())
    monkeypatch.setattr(rewards, "BUILD_S", 1.0)
    config = types.SimpleNamespace(task=path, data=None, task_options={}, reward_timeout=0.0)
    wrap = rewards.worker_first(config)
    with pytest.raises(tasks.TaskError, match=f"{path}: its import and make_task\\(\\) .* in the trainer: a task "
                                              "file is built twice, in the reward worker, then in the trainer"):
        tasks.get_task(path, wrap=wrap)
    wrap(None).close()
