"""Task registry: a plain dict from name to factory, and get_task(name, data=..., **options).

The text tasks (one file each), their options, data files and `rules=NAME` (RULES lists each task's
chat-style rule sets, the official one first and default): docs/tasks.md. The ImageNet checks are
experiments, not text tasks. A task of your own lives in a file outside the package (`--task
path/to/my_task.py`; tasks/custom.py fills in what it leaves out, tasks/template.py is a whole one).

Every task object has: name, rules, pass_threshold, examples(split, n, seed), prompt(example,
style), reward(completion, example, style), solution(example, style), reward_fn(completions,
**columns); optionally assistant_prefill, a string rollout.render_prompts puts after the assistant
header (knights_knaves' think_prefill).
"""

import inspect

from tasks import countdown, custom, deepmath, gsm8k, knights_knaves, text_match
from tasks.custom import TaskError, is_task_file, reward_number
from tasks._math import DEADLINE_S as MATH_DEADLINE_S, helper_process as math_helper_process
from tasks._verify import COMPACT_ALPHABET

TASKS = {
    "countdown": countdown.make_task,
    "knights_knaves": knights_knaves.make_task,
    "gsm8k": gsm8k.make_task,
    "deepmath": deepmath.make_task,
    "text_match": text_match.make_task,
}
NEEDS_DATA = ("gsm8k", "deepmath", "text_match")  # the tasks that read a data file (data=PATH)
RULES = {"countdown": countdown.RULES, "knights_knaves": knights_knaves.RULES, "gsm8k": gsm8k.RULES,
         "deepmath": deepmath.RULES, "text_match": text_match.RULES}  # chat-style rule sets, default first

__all__ = ["COMPACT_ALPHABET", "MATH_DEADLINE_S", "NEEDS_DATA", "RULES", "TASKS", "TaskError", "get_task",
           "is_task_file", "math_helper_process", "reward_number"]


def get_task(name, *, data=None, wrap=None, **options):
    """Build the task `name` (or the task file / module `name`: tasks/custom.py); `data`: a data
    file's path, `options`: its factory's. wrap: task -> the task returned (reward_worker.py),
    applied before a task file's rewards are first called, so that it bounds those calls too."""
    if name not in TASKS and is_task_file(name):
        return custom.load(name, data=data, wrap=wrap, **options)
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(sorted(TASKS))}")
    factory = TASKS[name]
    allowed = [p for p in inspect.signature(factory).parameters if p != "data"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"task {name!r} has no option(s) {unknown}; options: {allowed}")
    task = factory(data=data, **options)
    return wrap(task) if wrap else task
