"""Task registry: a plain dict from name to factory, and get_task(name, data=..., **options).

Text tasks (one file each):
  countdown       procedural arithmetic puzzles            options: num_count=(3, 4) | 3 | 4 | 2, format_score=0.0
                  (data=PATH: {nums, target} rows or verl rows instead of the generator)
  knights_knaves  procedural logic puzzles (Logic-RL)      options: people=(3, 4, 5), binary=False,
                                                           think_prefill=False (the prompt ends in <think>)
                  (data=PATH: Logic-RL's K&K parquet rows or verl rows instead of the generator)
  gsm8k           grade-school math, needs data=PATH or data="openai/gsm8k"   options: format_score=0.0,
                                                           answer_style="tags" | "boxed" (the official prompt)
  deepmath        DeepMath-103K, needs data=PATH or data="zwhe99/DeepMath-103K"   options: answer_style
  text_match      {prompt, reference} rows, F1 + ROUGE-L reward, needs data=PATH
                  options: format_weight=0.0 (0.35 with rules="openthoughts"), pass_threshold=0.5
Every text task also takes rules=NAME, the rule set of its chat-style reward (RULES lists them, the official
one first and default); the compact style of the tiny model always keeps the task's own compact rules.
The ImageNet checks are experiments, not text tasks (experiments/imagenet_toy.py, experiments/imagenet_real.py),
so they have no entry here.

A data file in verl's format (`prompt` chat messages + `reward_model.ground_truth`) is used verbatim by
countdown, knights_knaves, gsm8k and deepmath: the chat prompt is the file's messages (tasks/_data.py).

A task of your own lives in a file outside the package (`--task path/to/my_task.py`; tasks/custom.py fills in
what it leaves out, tasks/template.py is a complete one).

Every task object has: name, rules, pass_threshold, examples(split, n, seed), prompt(example, style),
reward(completion, example, style), solution(example, style), reward_fn(completions, **columns); optionally
assistant_prefill, a string rollout.render_prompts puts after the assistant header (knights_knaves' think_prefill).
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
    """Build the task `name` (or the task file / module `name`: tasks/custom.py); `data` is a file path for the
    data-file tasks, `options` go to its factory. wrap: a function of the task -> the task returned (a run's:
    harness/reward_worker.py), applied before a task file's rewards are first called, so that it bounds those calls too."""
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
