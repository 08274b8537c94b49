"""DeepMath: competition math problems with a LaTeX final answer (DeepMath-103K, as SoftmaxGRPO).

Data: rows {"question", "final_answer"} (other columns ignored) from data=PATH (JSONL or parquet, a
file, a folder with train and test files or the hub snapshot's shards; verl rows are used verbatim:
tasks/_data.py), or data="zwhe99/DeepMath-103K" with the `datasets` package (nothing is downloaded
unless asked for). One split: HOLDOUT held-out prompts ranked as SoftmaxGRPO's prepare_data.py ranks
them (official_key). Reward (DESIGN.md §6): chat, math-verify on the final text (tasks/_math.py),
binary; compact, the compacted completion equals the compacted final answer. answer_style: "tags"
(default; ours) or "boxed" (the official prompt).
"""

import json
import os
from dataclasses import dataclass, field

from tasks._data import hub_dataset, last_user_text, load_splits, ranked_holdout, sample_rows, \
    truth_answer
from tasks._math import math_answer_is_right, require_math_verify
from tasks._verify import ANSWER_STYLES, check_answer_style, check_rules, compact_text, completion_text, \
    final_text, math_prompt, rewards_from_columns

RULES = ("math_verify",)
HUB_NAME = "zwhe99/DeepMath-103K"
MAX_ANSWER_CHARS = 2000  # a longer final answer in the data is an error (math-verify reads at most 1000 characters)
HOLDOUT = 1000  # held-out prompts of a single file (SoftmaxGRPO README: prepare_data --validation-size 1000)
INSTRUCTION = ("Reason step by step inside <think> </think> tags, then give the final answer inside "
               "<answer> </answer> tags as \\boxed{...}.")


def parse_row(row):
    """One data row -> example {"question", "final_answer"} (both stripped, non-empty)."""
    question, answer = row["question"].strip(), row["final_answer"].strip()
    if not question or not answer:
        raise ValueError("field 'question' or 'final_answer' is empty")
    if len(answer) > MAX_ANSWER_CHARS:
        raise ValueError(f"field 'final_answer' is longer than {MAX_ANSWER_CHARS} characters")
    return {"question": question, "final_answer": answer}


def from_verl(truth, messages):
    """A verl-format row -> example {"question" (the last user message), "final_answer"}."""
    return parse_row({"question": last_user_text(messages), "final_answer": truth_answer(truth)})


def official_key(row):
    """The held-out key of a plain row: the official boxed prompt's messages, as prepare_data.py hashes them."""
    return json.dumps(math_prompt(row["question"], INSTRUCTION, "chat", "boxed"), sort_keys=True)


@dataclass
class DeepMathTask:
    """DeepMath task object; answer_style: the chat prompt's ask (ANSWER_STYLES: "tags" or the official "boxed")."""

    splits: dict = field(repr=False)
    rules: str = RULES[0]
    answer_style: str = ANSWER_STYLES[0]
    name: str = "deepmath"
    pass_threshold: float = 1.0

    def examples(self, split, n, seed):
        """Up to `n` rows of `split`, shuffled by seed (n=None: all)."""
        return [dict(row) for row in sample_rows(self.splits, split, n, seed, "deepmath")]

    def prompt(self, example, style="chat"):
        if style == "chat" and "messages" in example:  # a verl-format file's prompt, verbatim
            return [dict(message) for message in example["messages"]]
        return math_prompt(example["question"], INSTRUCTION, style, self.answer_style)

    def reward(self, completion, example, style="chat"):
        """1.0 for a right answer (chat: math-verify on the final text; compact: equal compacted text), else 0.0."""
        text = completion_text(completion)
        if style == "compact":
            wanted = compact_text(example["final_answer"])
            return 1.0 if wanted and compact_text(text[:MAX_ANSWER_CHARS * 2]) == wanted else 0.0
        return 1.0 if math_answer_is_right(example["final_answer"], final_text(text)) else 0.0

    def solution(self, example, style="compact"):
        if style == "compact":
            return compact_text(example["final_answer"])
        if self.answer_style == "boxed":
            return f"Working it out. The final answer is \\boxed{{{example['final_answer']}}}."
        return f"<think> Working it out. </think> <answer> \\boxed{{{example['final_answer']}}} </answer>"

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: column `final_answer`, one row per completion."""
        return rewards_from_columns(self.reward, completions, columns, ("final_answer",))


def _splits_from_datasets():
    loaded = hub_dataset("deepmath", HUB_NAME, split="train")
    rows = []
    for i, row in enumerate(loaded):
        try:
            rows.append(parse_row({"question": str(row["question"]), "final_answer": str(row["final_answer"])}))
        except (KeyError, ValueError) as error:
            raise ValueError(f"{HUB_NAME} row {i + 1}: {error}") from None
    return ranked_holdout(rows, official_key, HOLDOUT)


def make_task(data=None, rules=RULES[0], answer_style=ANSWER_STYLES[0]):
    """Factory for get_task("deepmath", data=PATH | "zwhe99/DeepMath-103K", rules="math_verify",
    answer_style="tags")."""
    check_rules("deepmath", rules, RULES)
    check_answer_style("deepmath", answer_style)
    require_math_verify("deepmath")
    if data is None:
        raise ValueError("deepmath needs data=PATH (JSONL or parquet rows with 'question' and 'final_answer', or a "
                         f"folder of them), or data={HUB_NAME!r} to load it with the `datasets` package")
    if data == HUB_NAME and not os.path.exists(data):
        splits = _splits_from_datasets()
    else:
        splits = load_splits(data, ("question", "final_answer"), key=official_key, parse=parse_row, verl=from_verl,
                             holdout=HOLDOUT)
    return DeepMathTask(splits=splits, rules=rules, answer_style=answer_style)
