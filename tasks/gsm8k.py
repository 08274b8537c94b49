"""GSM8K: grade-school math word problems with a numeric final answer.

Data: the official rows {"question", "answer"} (answer ending in "#### 42") from data=PATH (JSONL or
parquet, a file or a folder; verl rows are used verbatim: tasks/_data.py), or data="openai/gsm8k"
with the `datasets` package (nothing is downloaded unless asked for). Rules (chat style; DESIGN.md
§6): `math_verify` (default), the official check (tasks/_math.py), binary; `last_number`, ours: the
last \\boxed{} in the answer region, else its last number, as exact fractions ("1,000", "$1000",
"1000.0" all equal 1000), format_score for a wrong answer in the asked-for form. Compact style: the
last number. answer_style: "tags" (default; ours) or "boxed" (the official prompt).
"""

import os
import re
from dataclasses import dataclass, field
from fractions import Fraction

from tasks._data import hub_dataset, last_user_text, load_splits, sample_rows, truth_answer
from tasks._math import math_answer_is_right, require_math_verify
from tasks._verify import ANSWER_STYLES, answer_region, check_answer_style, check_rules, completion_text, \
    final_text, has_think_answer_format, last_number, math_prompt, rewards_from_columns

MAX_NUMBER_CHARS = 40  # longer "numbers" are not compared
MAX_BOXED_CHARS = 1000  # a \boxed{ not closed within this many characters counts as no \boxed{}
RULES = ("math_verify", "last_number")  # chat-style rule sets, default first
HUB_NAME = "openai/gsm8k"
_CALCULATOR = re.compile(r"<<[^<>]{0,200}>>")  # GSM8K's calculator annotations, e.g. <<48/2=24>>
INSTRUCTION = ("Reason step by step inside <think> </think> tags, then give only the final number inside "
               "<answer> </answer> tags, for example <answer> 42 </answer>.")


_BRACE = re.compile(r"[{}]")


def last_boxed(text):
    """Content of the last \\boxed{...} (braces balanced, closed within MAX_BOXED_CHARS), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for brace in _BRACE.finditer(text, i, i + MAX_BOXED_CHARS):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[i:brace.start()]
    return None


def to_number(text):
    """Fraction from "1,000", "$12.50", "-3", "7.0"; None when `text` is not a plain ASCII number."""
    cleaned = text.replace(",", "").replace("$", "").strip()
    if not cleaned or len(cleaned) > MAX_NUMBER_CHARS or not re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", cleaned):
        return None
    return Fraction(cleaned)


def extract_answer(text, style="chat"):
    """The predicted number (string) of a completion: \\boxed{} content or the last number, in the last
    <answer> block (chat; the whole completion when there is none) or in the whole completion (compact)."""
    region = text if style == "compact" else answer_region(text)
    boxed = last_boxed(region)
    if boxed is not None:
        region = boxed
    return last_number(region)


def parse_row(row):
    """One JSONL row -> example {"question", "answer" (final number), "rationale" (worked solution)}."""
    rationale, sep, final = row["answer"].rpartition("####")
    if not sep:
        raise ValueError("field 'answer' has no '#### <number>' line")
    final = final.strip().replace(",", "")
    if to_number(final) is None:
        raise ValueError(f"final answer {final!r} is not a number")
    return {"question": row["question"], "answer": final, "rationale": _CALCULATOR.sub("", rationale).strip()}


def from_verl(truth, messages):
    """A verl-format row -> example {"question" (the last user message), "answer", "rationale" ("")}."""
    return {"question": last_user_text(messages), "answer": truth_answer(truth), "rationale": ""}


@dataclass
class GSM8KTask:
    """GSM8K task object; rules: RULES; answer_style: ANSWER_STYLES; format_score: last_number's."""

    splits: dict = field(repr=False)
    format_score: float = 0.0
    rules: str = RULES[0]
    answer_style: str = ANSWER_STYLES[0]
    name: str = "gsm8k"
    pass_threshold: float = 1.0

    def examples(self, split, n, seed):
        """Up to `n` rows of `split`, shuffled by seed (n=None: all)."""
        return [dict(row) for row in sample_rows(self.splits, split, n, seed, "gsm8k")]

    def prompt(self, example, style="chat"):
        if style == "chat" and "messages" in example:  # a verl-format file's prompt, verbatim
            return [dict(message) for message in example["messages"]]
        return math_prompt(example["question"], INSTRUCTION, style, self.answer_style)

    def well_formatted(self, text):
        """The chat completion gives its answer in the form the prompt asked for."""
        return last_boxed(text) is not None if self.answer_style == "boxed" else has_think_answer_format(text)

    def reward(self, completion, example, style="chat"):
        """1.0 for a right answer (chat, rules="math_verify": math-verify on the final text; otherwise the
        extracted number equals the answer); else format_score for a well-formatted chat completion
        (rules="last_number"); else 0.0."""
        text = completion_text(completion)
        if style == "chat" and self.rules == "math_verify":
            return 1.0 if math_answer_is_right(example["answer"], final_text(text)) else 0.0
        predicted = extract_answer(text, style)
        target = to_number(example["answer"])
        if predicted is not None and target is not None and to_number(predicted) == target:
            return 1.0
        return self.format_score if style == "chat" and self.well_formatted(text) else 0.0

    def solution(self, example, style="compact"):
        if style == "compact":
            return example["answer"]
        if self.answer_style == "boxed":
            return f"{example['rationale']}\nThe final answer is \\boxed{{{example['answer']}}}."
        return f"<think> {example['rationale']} </think> <answer> {example['answer']} </answer>"

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: column `answer` (the final number), one row per completion."""
        return rewards_from_columns(self.reward, completions, columns, ("answer",))


def _splits_from_datasets():
    loaded, splits = hub_dataset("gsm8k", HUB_NAME, "main"), {}
    for split in ("train", "test"):
        splits[split] = []
        for i, row in enumerate(loaded[split]):
            try:
                splits[split].append(parse_row(row))
            except ValueError as error:
                raise ValueError(f"openai/gsm8k {split} row {i + 1}: {error}") from None
    return splits


def make_task(data=None, format_score=0.0, rules=RULES[0], answer_style=ANSWER_STYLES[0]):
    """Factory for get_task("gsm8k", data=PATH | "openai/gsm8k", format_score=0.0, rules="math_verify",
    answer_style="tags")."""
    check_rules("gsm8k", rules, RULES)
    check_answer_style("gsm8k", answer_style)
    if rules == "math_verify":
        require_math_verify("gsm8k")
        if format_score:
            raise ValueError("gsm8k: format_score belongs to rules='last_number'; the official 'math_verify' "
                             "rules are binary")
    if data is None:
        raise ValueError("gsm8k needs data=PATH (JSONL or parquet rows with 'question' and 'answer', or a folder "
                         f"with train and test files), or data={HUB_NAME!r} to load it with the `datasets` package")
    if data == HUB_NAME and not os.path.exists(data):
        splits = _splits_from_datasets()
    else:
        splits = load_splits(data, ("question", "answer"), key="question", parse=parse_row, verl=from_verl)
    return GSM8KTask(splits=splits, format_score=float(format_score), rules=rules, answer_style=answer_style)
