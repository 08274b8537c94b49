"""A task of your own, in one file outside the package: `--task path/to/my_task.py` or `--task package.module`.

The module defines make_task(data=None, **options) (--data and --task-option reach it) returning an object with at
least reward(completion, example, style="chat") -> a number. The rest has a default (docs/tasks.md, "Write your
own task"; tasks/template.py is a complete one):
  examples(split, n, seed)   rows of --data (JSONL or parquet, a string "prompt" each; split as tasks/_data.py does)
  prompt(example, style)     chat: [{"role": "user", "content": example["prompt"]}]; compact (the tiny model's
                             character vocabulary): the text lower-cased, other characters as spaces, then ":"
  pass_threshold             1.0: a completion passes when its reward reaches it
  name, rules                the file's name, "custom"
  solution(example, style)   none: then no warm start (the tiny model starts from random weights)
  reward_fn(completions, **columns)   TRL GRPOTrainer's form, built from reward
What the object lacks or returns wrong is a TaskError (a ValueError: train.py prints one line naming the file),
checked on two training examples when the task is built and on every reward afterwards. An exception raised
inside reward() is a bug in the file: its traceback shows, then one line naming the completion (TaskCodeError).
"""
import contextlib
import decimal
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import re
import sys

from tasks._data import load_splits, sample_rows
from tasks._verify import compact_text, completion_text

MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")  # package.module
DEFAULT_PASS_THRESHOLD = 1.0


class TaskError(ValueError):
    """A task file that does not keep the protocol (one line, naming the file)."""


REWARD_LIMIT = 1e15  # |reward| at most: float32 (the loop's dtype) holds 3.4e38, but GRPO's group std squares
# reward differences, and (2 * 1e15)**2 summed over a batch of 8e7 rewards (or reinforce_pp's tokens) stays below it


def reward_number(value, source, completion):
    """A reward as the float the loop computes with: a real number within +-REWARD_LIMIT (an int, a bool, a float, a
    Fraction, a Decimal, a numpy integer, float or bool scalar: numbers.Real and those two), converted with float().
    Else a TaskError naming `source` (the task): a string, None, a complex number, an array or tensor (return
    .item()), nan, inf, and a number beyond the range (3e38 fits float32 yet overflows GRPO's group std; -1e308
    does not fit float32 at all): one of those would turn every advantage of its group into nan, and clamping it
    would change what the task rewards (docs/tasks.md)."""
    numpy = sys.modules.get("numpy")  # a numpy bool comes only from a task that imported numpy
    real = isinstance(value, (numbers.Real, decimal.Decimal)) or (numpy is not None and isinstance(value, numpy.bool_))
    failed = ""  # float(value)'s own error, when it raised one
    if real:
        try:
            number = float(value)
        except Exception as error:  # 10**400, Fraction(10**400), Decimal('sNaN'), a __float__ that raises
            number, failed = math.nan, f" (float() of it raised {type(error).__name__})"
        if abs(number) <= REWARD_LIMIT:
            return number
    try:
        shown = repr(value)[:80]
    except Exception:  # an int of more than 4300 digits has no repr; nor has a subclass whose __repr__ raises
        shown = "a huge integer" if isinstance(value, int) else f"a {type(value).__name__} without a repr"
    raise TaskError(f"{source}: reward() returned {shown} ({type(value).__name__}){failed} for the completion "
                    f"{completion[:80]!r}; a reward must be "
                    + (f"a number from {-REWARD_LIMIT:g} to {REWARD_LIMIT:g} (the loop computes in float32, and "
                       "its group statistics square reward differences), not nan or inf" if real else
                       "a real number (int, float, bool, Fraction, Decimal or a numpy scalar; of a tensor or array, "
                       "its .item())"))


class TaskCodeError(RuntimeError):
    """An exception raised inside the task file's reward(): a bug there, shown with its traceback (chained)."""


def is_task_file(name):
    """Whether --task names a file (ends in .py) or an importable module (dotted), rather than a built-in task."""
    return name.endswith(".py") or MODULE_NAME.fullmatch(name) is not None


def source_file(name):
    """The absolute path of the task's Python file; TaskError if there is none."""
    if name.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(name))
        if not os.path.isfile(path):
            raise TaskError(f"--task {name}: no such file")
        return path
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise TaskError(f"--task {name}: no such module (a task file is path/to/file.py; a module, package.module "
                        "importable from here)")
    return spec.origin


def load(name, *, data=None, wrap=None, **options):
    """Import the task file or module `name`, call its make_task(data=data, **options) -> a
    FileTask, or wrap(it) (harness/reward_worker.py's: a worker process; its `building` around the
    build), its protocol checked through that (check_protocol)."""
    with getattr(wrap, "building", contextlib.nullcontext)():
        task = build(name, data=data, **options)
    return check_protocol(wrap(task) if wrap else task)


def build(name, *, data=None, **options):
    """load's FileTask, unchecked: what harness/reward_worker.py's worker process builds again (load checked it)."""
    path = source_file(name)
    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"task_file_{hashlib.sha256(path.encode()).hexdigest()[:12]}",
                                                      path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # the user's own code: an error in it shows its traceback
    else:
        module = importlib.import_module(name)
    make_task = getattr(module, "make_task", None)
    if not callable(make_task):
        raise TaskError(f"{path}: no make_task(data=None, **options) function")
    parameters = inspect.signature(make_task).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
    unknown = sorted(set(options) - set(parameters)) if not takes_any else []
    if unknown or ("data" not in parameters and not takes_any):
        raise TaskError(f"{path}: make_task takes no " + (f"option(s) {unknown}" if unknown else "data= argument")
                        + f"; its parameters: {list(parameters)}")
    return FileTask(make_task(data=data, **options), path, data)


def check_protocol(task):
    """The protocol checked on two training examples before any training: their prompts, the rewards of an empty
    completion and of the solution. -> task."""
    for example in task.examples("train", 2, seed=0):
        task.prompt(example, "chat")
        task.reward("", example, style="chat")
        if hasattr(task, "solution"):
            task.reward(task.solution(example, "chat"), example, style="chat")
    return task


class FileTask:
    """The user's task object with the protocol's defaults filled in and its answers checked (module docstring)."""

    def __init__(self, user, source, data):
        self.user, self.source = user, source
        if not callable(getattr(user, "reward", None)):
            raise TaskError(f"{source}: make_task() returned {type(user).__name__}, which has no "
                            "reward(completion, example, style) method")
        self.name = getattr(user, "name", os.path.splitext(os.path.basename(source))[0])
        self.rules = getattr(user, "rules", "custom")
        self.pass_threshold = getattr(user, "pass_threshold", DEFAULT_PASS_THRESHOLD)
        self.assistant_prefill = getattr(user, "assistant_prefill", "")
        if isinstance(self.pass_threshold, bool) or not isinstance(self.pass_threshold, (int, float)) \
                or not math.isfinite(self.pass_threshold):
            raise TaskError(f"{source}: pass_threshold must be a finite number, got {self.pass_threshold!r}")
        parameters = inspect.signature(user.reward).parameters.values()
        self.reward_takes_style = len(parameters) >= 3 or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                                              for p in parameters)
        self.splits = None
        if not hasattr(user, "examples"):
            if data is None:
                raise TaskError(f"{source}: the task has no examples(split, n, seed) method, so it needs --data (a "
                                'JSONL or parquet file of {"prompt": ...} rows)')
            self.splits = load_splits(data, ("prompt",), key="prompt")
        if hasattr(user, "solution"):
            self.solution = self._solution

    def examples(self, split, n, seed):
        if self.splits is not None:
            return sample_rows(self.splits, split, n, seed, self.name)
        rows = self.user.examples(split, n, seed)
        if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
            raise TaskError(f"{self.source}: examples({split!r}, {n}, {seed}) must return a non-empty list of dicts, "
                            f"got {type(rows).__name__}" + (" (empty)" if rows == [] else ""))
        return rows

    def prompt(self, example, style="chat"):
        if hasattr(self.user, "prompt"):
            prompt = self.user.prompt(example, style)
            messages = isinstance(prompt, list) and prompt and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt)
            if not (isinstance(prompt, str) or messages):
                raise TaskError(f"{self.source}: prompt() must return a string or a list of "
                                f"{{'role', 'content'}} messages, got {type(prompt).__name__}")
            return prompt
        text = example.get("prompt")
        if not isinstance(text, str):
            raise TaskError(f"{self.source}: an example has no string 'prompt' (give the task a prompt(example, "
                            "style) method or such a field)")
        return [{"role": "user", "content": text}] if style == "chat" else compact_text(text) + ":"

    def reward(self, completion, example, style="chat"):
        try:
            value = self.user.reward(completion, example, style) if self.reward_takes_style else \
                self.user.reward(completion, example)
        except Exception as error:  # not a ValueError any more: a bug in the file keeps its traceback (above)
            raise TaskCodeError(f"{self.source}: reward() raised {type(error).__name__} on the completion "
                                f"{completion[:200]!r} of the example {str(example)[:200]}") from error
        return reward_number(value, self.source, completion)

    def _solution(self, example, style="compact"):
        text = self.user.solution(example, style)
        if not isinstance(text, str):
            raise TaskError(f"{self.source}: solution() must return a string, got {type(text).__name__}")
        return text

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: every dataset column reaches reward() as the example's fields."""
        rows = [{key: values[i] for key, values in columns.items() if isinstance(values, (list, tuple))}
                for i in range(len(completions))]
        return [self.reward(completion_text(c), row) for c, row in zip(completions, rows)]
