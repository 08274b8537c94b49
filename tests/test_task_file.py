"""A task of your own in one file (tasks/custom.py, tasks/template.py): what it may leave out, what it may not get
wrong, and what a bug in it costs (a traceback into the file, nothing lost, a resume once it is fixed)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness import checkpoint, metrics
from harness.manifest import file_sha256
import tasks
import train
from tests.run_cli import fails
from tests.stubs import SMALL_TRAIN as SMALL

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE, TEMPLATE_DATA = os.path.join(REPO, "tasks", "template.py"), os.path.join(REPO, "tasks", "template_qa.jsonl")
pytestmark = pytest.mark.usefixtures("one_thread")

DIGITS_TASK = """
import random

class Digits:
    def __init__(self, break_after):
        self.calls, self.break_after = 0, break_after

    def examples(self, split, n, seed):
        rng = random.Random(f"{split}-{seed}")
        return [{"prompt": f"{rng.randint(0, 99)}>"} for _ in range(n)]

    def reward(self, completion, example, style="chat"):
        self.calls += 1
        if self.break_after is not None and self.calls > self.break_after:
            return {BROKEN}
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)

def make_task(data=None, break_after=None):
    return Digits(break_after)
"""


def task_file(tmp_path, text, name="my_task.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def one_line(capsys, argv, code=2):  # a bad task file is a flag's error: exit 2
    return fails(capsys, argv, code)


# --- the template, as shipped -------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", [TEMPLATE, "tasks.template"])
def test_the_template_trains_on_the_tiny_model(tmp_path, task):
    result = train.main(["--task", task, "--data", TEMPLATE_DATA, "--output-dir", str(tmp_path / "run"), *SMALL,
                         "--steps", "2"])
    rows = [json.loads(line) for line in open(result["metrics_path"])]
    assert [r["step"] for r in rows if not r.get("eval")] == [1, 2] and 0 <= result["after"]["pass@1"] <= 1
    saved = json.load(open(tmp_path / "run" / "checkpoint-2" / "run.json"))
    assert saved["task"] == (TEMPLATE if task.endswith(".py") else task) and saved["task_file_sha256"] == file_sha256(TEMPLATE)


def test_the_template_reward_by_hand_and_as_a_trl_reward_function():
    task = tasks.get_task(TEMPLATE, data=TEMPLATE_DATA)
    example = {"prompt": "what is 7 plus 5?", "answer": "12"}
    assert [task.reward(c, example) for c in ("12", "I think\n12.", "<answer> 12 </answer>", "13", "")] == \
        [1.0, 1.0, 1.0, 0.0, 0.0]
    assert task.reward_fn(["12", [{"role": "assistant", "content": "<answer>7</answer>"}]],
                          prompts=["a", "b"], answer=["12", "8"]) == [1.0, 0.0]  # TRL passes dataset columns
    assert task.pass_threshold == 1.0 and task.name == "exact_answer"
    assert task.prompt(example, "compact") == "what is 7 plus 5:"


# --- what a task may leave out ------------------------------------------------------------------------------------
def test_a_reward_and_a_data_file_are_enough(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(40)))
    path = task_file(tmp_path, """
        def make_task(data=None):
            class Echo:
                def reward(self, completion, example):
                    return example["answer"] in completion
            return Echo()
        """)
    task = tasks.get_task(path, data=str(data))
    example = task.examples("train", 1, seed=0)[0]
    assert task.prompt(example, "chat") == [{"role": "user", "content": example["prompt"]}]
    assert task.reward(f"it is {example['answer']}", example) == 1.0 and task.pass_threshold == 1.0
    assert task.name == "my_task" and task.rules == "custom" and not hasattr(task, "solution")
    train.main(["--task", path, "--data", str(data), "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1",
                "--warm-start-steps", "5"])
    assert "has no solution(example, style): no warm start" in capsys.readouterr().out


# --- what it may not get wrong: one line naming the file, before any training --------------------------------------
@pytest.mark.parametrize("body,message", [
    ("x = 1", "no make_task(data=None, **options) function"),
    ("def make_task(data=None):\n    return object()", "which has no reward(completion, example, style) method"),
    ("def make_task(data=None):\n    class T:\n        def reward(self, c, e, s='chat'):\n            return 1\n"
     "    return T()", "the task has no examples(split, n, seed) method, so it needs --data"),
    (DIGITS_TASK.replace("{BROKEN}", "1").replace("return sum(", "return 'yes' or sum("),
     "reward() returned 'yes' (str)"),
    (DIGITS_TASK.replace("{BROKEN}", "1").replace("return sum(", "return float('nan') or sum("),
     "reward() returned nan (float)"),
    (DIGITS_TASK.replace("{BROKEN}", "1").replace("return sum(", "return 10**400 or sum("),
     "reward() returned 1000"),  # beyond a float: an OverflowError traceback before
    (DIGITS_TASK.replace("{BROKEN}", "1").replace("return sum(", "return __import__('decimal').Decimal('NaN') or sum("),
     "reward() returned Decimal('NaN') (Decimal)"),
    (DIGITS_TASK.replace("{BROKEN}", "1").replace("return sum(", "return 1j or sum("),
     "reward() returned 1j (complex)"),
    (DIGITS_TASK.replace("{BROKEN}", "1").replace("def make_task(data=None, break_after=None)",
                                                  "def make_task(break_after=None)"), "make_task takes no data="),
])
def test_a_task_file_that_breaks_the_protocol_is_one_line(tmp_path, capsys, body, message):
    path = task_file(tmp_path, body)
    err = one_line(capsys, ["--task", path, "--output-dir", str(tmp_path / "run"), *SMALL])
    assert path in err and message in err
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


@pytest.mark.parametrize("kind", ["int", "bool", "numpy.float32", "numpy.int64", "numpy.bool_", "fractions.Fraction",
                                  "decimal.Decimal"])
def test_a_reward_that_is_any_real_number_trains_as_its_float(tmp_path, kind):
    # numpy scalars, Fraction and Decimal were refused as "not a finite number" (docs/tasks.md: what a reward may be)
    module, _, name = kind.rpartition(".")
    convert = f"__import__({module!r}).{name}" if module else name
    value = "c.isdigit() for c in completion) > 0" if kind.endswith(("bool", "int", "int64", "bool_")) else \
        "c.isdigit() for c in completion) / max(len(completion), 1)"
    body = DIGITS_TASK.replace("{BROKEN}", "1").replace(
        "return sum(c.isdigit() for c in completion) / max(len(completion), 1)", f"return {convert}(sum({value})")
    out = tmp_path / "run"
    train.main(["--task", task_file(tmp_path, body), "--output-dir", str(out), *SMALL, "--steps", "1"])
    [row] = [row for row in metrics.read_metrics(str(out / "metrics.jsonl")) if not row.get("eval")]
    assert isinstance(row["reward_mean"], float) and 0 <= row["reward_mean"] <= 1


def test_a_registered_task_whose_reward_is_not_a_number_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    # a task object registered in Python (not a file) returning text: float("0.5") took it silently
    from tests.stubs import DigitsTask
    monkeypatch.setitem(tasks.TASKS, "digits", lambda data=None: DigitsTask())
    monkeypatch.setattr(DigitsTask, "reward", lambda self, completion, example, style="chat": "0.5")
    err = one_line(capsys, ["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "1"])
    assert "task digits: reward() returned '0.5' (str)" in err and "a real number" in err


def test_a_missing_task_file_or_unknown_option_is_one_line_before_torch(tmp_path, capsys):
    proc = subprocess.run([sys.executable, "train.py", "--task", "no/such_task.py"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "train.py: error: --task no/such_task.py: no such file"
    path = task_file(tmp_path, DIGITS_TASK.replace("{BROKEN}", "1"))
    err = one_line(capsys, ["--task", path, "--task-option", "colour=3", "--output-dir", str(tmp_path / "r"), *SMALL])
    assert "make_task takes no option(s) ['colour']" in err


def test_the_dry_run_checks_a_task_file(tmp_path, capsys):
    path = task_file(tmp_path, DIGITS_TASK.replace("{BROKEN}", "1"))
    train.main(["--task", path, "--dry-run", *SMALL])
    out = capsys.readouterr().out
    shown = json.loads(out[out.index("{"):])
    assert shown["task"] == path and shown["task_file_sha256"] == file_sha256(path)
    broken = task_file(tmp_path, "def make_task(data=None):\n    return 3\n", name="broken.py")
    assert "has no reward" in one_line(capsys, ["--task", broken, "--dry-run"])


# --- a bug in the file: its traceback, nothing lost, a resume once fixed -------------------------------------------
def test_a_reward_that_raises_mid_run_shows_its_traceback_and_the_run_resumes_once_fixed(tmp_path):
    # probe 2 rewards + step-0 eval 4 + step 1: 8 + step 2: 8 + its eval 4 = 26; the 29th raises, in step 3
    path = task_file(tmp_path, DIGITS_TASK.replace("{BROKEN}", "1 / 0"))
    out = str(tmp_path / "run")
    command = [sys.executable, "train.py", "--task", path, "--task-option", "break_after=28", "--output-dir", out,
               *SMALL, "--steps", "4", "--save-every", "2"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr
    assert f'File "{path}"' in proc.stderr and "ZeroDivisionError" in proc.stderr  # the frame in the user's file
    assert "the run stopped in step 3 on the error below" in proc.stderr
    assert f"{path}: reward() raised ZeroDivisionError on the completion" in proc.stderr.splitlines()[-1]
    assert checkpoint.checkpoint_steps(out) == [2]
    with open(path, "w") as f:  # the fix
        f.write(textwrap.dedent(DIGITS_TASK.replace("{BROKEN}", "0.0")))
    resume = [sys.executable, "train.py", "--resume", out]
    proc = subprocess.run(resume, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and f"add --task {path}" in proc.stderr, proc.stderr  # code is named, not found
    proc = subprocess.run(resume + ["--task", path], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "is not the file this run started with" in proc.stdout, proc.stderr
    assert checkpoint.checkpoint_steps(out) == [2, 4]


def test_a_bug_before_a_resumed_runs_first_step_names_that_step(tmp_path):
    # a resumed run of 4 steps that fails while starting was reported as "the run stopped in step 1"
    body = DIGITS_TASK.replace("{BROKEN}", "1").replace(
        "    def examples(self, split, n, seed):\n",
        "    def examples(self, split, n, seed):\n        if split == 'test' and __import__('os').environ.get('BUG'):\n"
        "            raise RuntimeError('a bug in examples')\n")
    path, out = task_file(tmp_path, body), str(tmp_path / "run")
    train.main(["--task", path, "--output-dir", out, *SMALL, "--steps", "4", "--save-every", "2"])
    proc = subprocess.run([sys.executable, "train.py", "--resume", out, "--task", path, "--steps", "6"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "BUG": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "a bug in examples" in proc.stderr, proc.stderr
    assert "the run stopped before step 5 on the error below" in proc.stderr
    assert f"python train.py --resume {out} --task {path} continues from checkpoint-4" in proc.stderr  # the command


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_handed_over_run_folder_never_imports_a_task_file_of_its_choosing(tmp_path, dry_run):
    # run.json may name any .py file, with task_file_sha256 set to that file's own hash: a resume must not import
    # it unless the command line names it (--task), and then the file named is the one imported.
    out = tmp_path / "run"
    train.main(["--task", "countdown", "--output-dir", str(out), *SMALL, "--steps", "2"])
    marker = tmp_path / "imported"
    planted = task_file(tmp_path, f"open({str(marker)!r}, 'w').write('ran')\n" + DIGITS_TASK.replace("{BROKEN}", "1"),
                        name="planted.py")
    settings_path = out / "checkpoint-2" / "run.json"
    settings = json.load(open(settings_path))
    settings.update(task=planted, task_file_sha256=file_sha256(planted))
    settings_path.write_text(json.dumps(settings))
    before = sorted(os.listdir(out)), open(out / "metrics.jsonl").read()
    command = [sys.executable, "train.py", "--resume", str(out), "--steps", "3"] + (["--dry-run"] if dry_run else [])
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "a resume imports only code its command line names" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not marker.exists()
    assert (sorted(os.listdir(out)), open(out / "metrics.jsonl").read()) == before
    proc = subprocess.run(command + ["--task", "countdown"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "whose task is your own code" in proc.stderr and not marker.exists(), proc.stderr


def test_a_reward_that_turns_nan_mid_run_is_one_line_and_keeps_the_files(tmp_path, capsys):
    path = task_file(tmp_path, DIGITS_TASK.replace("{BROKEN}", "float('nan')"))
    out = str(tmp_path / "run")
    err = one_line(capsys, ["--task", path, "--task-option", "break_after=28", "--output-dir", out, *SMALL,
                            "--steps", "4", "--save-every", "2"])
    assert "reward() returned nan (float)" in err and checkpoint.checkpoint_steps(out) == [2]
    assert [r["step"] for r in metrics.read_metrics(os.path.join(out, "metrics.jsonl"))] == [0, 1, 2, 2]


@pytest.mark.parametrize("value,method", [("3e38", "grpo"), ("-1e308", "rloo"), ("1e16", "grpo")])
def test_a_reward_beyond_the_loops_range_is_one_line_naming_the_range(tmp_path, capsys, value, method):
    # 3e38 fits float32 but overflowed GRPO's and RLOO's group statistics: a nan step, nan weights saved; -1e308 was
    # called "non-finite" (it is, in float32)
    path = task_file(tmp_path, DIGITS_TASK.replace("{BROKEN}", value))
    out = str(tmp_path / "run")
    err = one_line(capsys, ["--task", path, "--task-option", "break_after=28", "--output-dir", out, *SMALL,
                            "--steps", "4", "--save-every", "2", "--method", method])
    assert f"{path}: reward() returned {float(value)!r} (float)" in err and "from -1e+15 to 1e+15" in err
    assert checkpoint.checkpoint_steps(out) == [2]


def test_a_run_json_from_before_the_newer_settings_still_resumes(tmp_path):
    out = tmp_path / "run"
    train.main(["--task", "countdown", "--output-dir", str(out), *SMALL, "--steps", "2"])
    settings_path = out / "checkpoint-2" / "run.json"
    from harness.config import ADDED_SETTINGS  # what the run.json of commit 80072f0 did not hold
    older = {k: v for k, v in json.loads(settings_path.read_text()).items() if k not in ADDED_SETTINGS}
    settings_path.write_text(json.dumps(older))
    os.remove(out / "checkpoint-2" / "manifest.json")  # nor its manifest: an older checkpoint (a note says so),
    import torch  # whose trainer_state.pt has no word of one either
    state = out / "checkpoint-2" / checkpoint.TRAINER_STATE
    torch.save({k: v for k, v in torch.load(state, weights_only=True).items() if k != "manifest.json"}, state)
    assert train.main(["--resume", str(out), "--steps", "3"])["after"] is not None
    assert checkpoint.checkpoint_steps(str(out))[-1] == 3


def test_resuming_a_run_whose_task_file_is_gone_is_one_line(tmp_path, capsys):
    path = task_file(tmp_path, DIGITS_TASK.replace("{BROKEN}", "1"))
    train.main(["--task", path, "--output-dir", str(tmp_path / "run"), *SMALL, "--steps", "2"])
    os.rename(path, path + ".moved")
    assert f"add --task {path}" in one_line(capsys, ["--resume", str(tmp_path / "run"), "--steps", "3"], code=1)
    assert f"--task {path}: no such file" in one_line(capsys, ["--resume", str(tmp_path / "run"), "--steps", "3",
                                                               "--task", path])


HANGING_TASK = DIGITS_TASK.replace("{BROKEN}", "1").replace(
    "return sum(", "while self.calls > 14:  # step 2's first call\n            pass\n        return sum(")


def test_a_reward_that_hangs_is_stopped_by_its_time_limit_in_one_line(tmp_path):
    # probe 2 + step-0 eval 4 + step 1 8 = 14 calls, then step 2 hangs (a pure-Python loop): no answer before this
    path = task_file(tmp_path, HANGING_TASK)
    out = str(tmp_path / "run")
    command = [sys.executable, "train.py", "--task", path, "--output-dir", out, *SMALL, "--steps", "4",
               "--save-every", "1", "--reward-timeout", "2"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert last.startswith("train.py: error: task my_task: reward() ran for more than 2 s") and "--reward-timeout" in last


def test_sigterm_inside_a_hanging_reward_ends_the_run_in_seconds(tmp_path):
    # the first SIGTERM used to wait for the step to end, i.e. forever; now it ends the run, the last checkpoint kept
    path = task_file(tmp_path, HANGING_TASK)
    out = str(tmp_path / "run")
    command = [sys.executable, "train.py", "--task", path, "--output-dir", out, *SMALL, "--steps", "4",
               "--save-every", "1", "--reward-timeout", "0"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not os.path.isdir(os.path.join(out, "checkpoint-1")) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # inside step 2's hanging reward by now
    proc.send_signal(signal.SIGTERM)
    sent = time.time()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and time.time() - sent < 15, stderr  # the reward's 5 s grace, then the exit
    assert "did not return within 5 s of the stop signal" in stdout and f"--resume {out}" in stdout
    assert checkpoint.checkpoint_steps(out) == [1]


PROBE_HANGS = DIGITS_TASK.replace("{BROKEN}", "1").replace(
    "        self.calls += 1\n", "        self.calls += 1\n        while completion == '':  # the check's empty one\n"
    "            pass\n")


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_a_reward_that_hangs_while_the_task_file_is_checked_is_stopped_by_its_time_limit(tmp_path, dry_run):
    """The rewards that check a task file as it is built (an empty completion's) run under --reward-timeout too."""
    path = task_file(tmp_path, PROBE_HANGS)
    command = [sys.executable, "train.py", "--task", path, "--output-dir", str(tmp_path / "run"), *SMALL,
               "--reward-timeout", "1"] + (["--dry-run"] if dry_run else [])
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert last.startswith("train.py: error: task my_task: reward() ran for more than 1 s on the completion ''")
    assert f"fix the task ({path}), or raise --reward-timeout" in last


# --- a task's code cannot end a run silently, or hang its start (issue 61) ----------------------------------------
@pytest.mark.parametrize("raised,shown", [("SystemExit(0)", "SystemExit(0)"),
                                          ("KeyboardInterrupt", "KeyboardInterrupt"),
                                          ("type('Quit', (BaseException,), {})('bye')", "Quit('bye')")])
def test_a_reward_that_raises_a_base_exception_is_one_line_naming_the_task_and_the_call(tmp_path, capsys, raised,
                                                                                      shown):
    # SystemExit(0) in step 3's reward ended the run with exit code 0, two steps short, without a word
    path = task_file(tmp_path, DIGITS_TASK.replace("return {BROKEN}", f"raise {raised}"))
    out = str(tmp_path / "run")
    err = one_line(capsys, ["--task", path, "--task-option", "break_after=28", "--output-dir", out, *SMALL,
                            "--steps", "4", "--save-every", "2"])
    assert f"task my_task: reward() raised {shown} on the completion" in err and path in err
    assert checkpoint.checkpoint_steps(out) == [2]


@pytest.mark.parametrize("method,call", [("examples", "examples('train', 2, seed=0)"),
                                         ("solution", "solution({'prompt': ")])
def test_examples_or_a_solution_that_hang_as_the_task_is_built_are_stopped_by_the_time_limit(tmp_path, capsys,
                                                                                             method, call):
    body = DIGITS_TASK.replace("{BROKEN}", "1").replace("    def examples(self, split, n, seed):\n", (
        "    def solution(self, example, style):\n        while True:\n            pass\n\n"
        if method == "solution" else "") + "    def examples(self, split, n, seed):\n"
        + ("        while True:\n            pass\n" if method == "examples" else ""))
    path = task_file(tmp_path, body)
    started = time.time()
    err = one_line(capsys, ["--task", path, "--output-dir", str(tmp_path / "run"), *SMALL, "--reward-timeout", "1"])
    assert err.startswith(f"train.py: error: task my_task: {call}") and "ran for more than 1 s" in err, err
    assert time.time() - started < 30


BLOCKS = {"its import": "import time\ntime.sleep(1000)\n",
          "make_task()": "import time\n\ndef make_task(data=None):\n    while True:\n        try:\n"
                         "            time.sleep(1000)\n        except BaseException:\n            pass\n"}
BUILD_LIMIT = """import sys
sys.path.insert(0, {repo!r})
try:
    from harness import reward_worker as worker
except ImportError:  # 2c9f269's name
    from harness import rewards as worker
worker.BUILD_S = 3  # the stated limit, here a short one
import train
train.main(sys.argv[1:])
"""


@pytest.mark.parametrize("where", list(BLOCKS))
def test_a_task_file_whose_import_or_make_task_blocks_is_one_line_within_the_build_limit(tmp_path, where):
    # 2c9f269: the run hung with no limit and no word (this test's timeout ended it)
    path = task_file(tmp_path, BLOCKS[where])
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", BUILD_LIMIT.format(repo=REPO), "--task", path, "--dry-run",
                           "--reward-timeout", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"train.py: error: task {path}: its import and make_task() ran for more than 3 s; fix the task, or raise "
        "--reward-timeout"], proc.stderr
    assert time.time() - started < 60


def test_ctrl_c_while_a_task_file_blocks_its_start_is_one_line(tmp_path):
    # 2c9f269: a 27-line KeyboardInterrupt traceback
    path = task_file(tmp_path, f"import time\nopen({str(tmp_path / 'importing')!r}, 'w').close()\n"
                               "time.sleep(1000)\n")
    proc = subprocess.Popen([sys.executable, "train.py", "--task", path, "--dry-run"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not os.path.exists(tmp_path / "importing") and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err and len((out + err).strip().splitlines()) == 1, err
    assert "Ctrl-C: stopped before the first step; nothing was saved" in out
