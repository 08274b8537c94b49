"""GSM8K: grade-school math word problems with a numeric final answer.

Data: the official JSONL rows {"question", "answer"} where the answer ends in "#### 42", from data=PATH (a
.jsonl file or a folder with train.jsonl and test.jsonl), or from the `datasets` package (openai/gsm8k) when
it is installed and online. Verifier: the last \\boxed{...} in the answer region, else the last number there;
compared as exact fractions after dropping commas and "$" (so "1,000", "$1000" and "1000.0" all equal 1000).
"""

import re
from dataclasses import dataclass, field
from fractions import Fraction

from tasks._data import load_splits, sample_rows
from tasks._verify import answer_region, chat_messages, compact_text, completion_text, \
    has_think_answer_format, last_number, rewards_from_columns

MAX_NUMBER_CHARS = 40  # longer "numbers" are not compared
_CALCULATOR = re.compile(r"<<[^<>]{0,200}>>")  # GSM8K's calculator annotations, e.g. <<48/2=24>>


def last_boxed(text):
    """Content of the last \\boxed{...} (braces balanced), or None. Linear scan."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
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


@dataclass
class GSM8KTask:
    """GSM8K task object (interface in notes/interfaces.md); format_score: reward for a wrong answer given in
    the <think>/<answer> format (0.0 = plain binary accuracy)."""

    splits: dict = field(repr=False)
    format_score: float = 0.0
    name: str = "gsm8k"
    pass_threshold: float = 1.0

    def examples(self, split, n, seed):
        """Up to `n` rows of `split`, shuffled by seed (n=None: all)."""
        return [dict(row) for row in sample_rows(self.splits, split, n, seed, "gsm8k")]

    def prompt(self, example, style="chat"):
        if style == "compact":
            return compact_text(example["question"]) + ":"
        if style != "chat":
            raise ValueError(f"style must be 'chat' or 'compact', got {style!r}")
        return chat_messages(f"{example['question']}\nReason step by step inside <think> </think> tags, then "
                             "give only the final number inside <answer> </answer> tags, for example "
                             "<answer> 42 </answer>.")

    def reward(self, completion, example, style="chat"):
        """1.0 when the extracted number equals the answer; else format_score for a well-formatted chat
        completion; else 0.0."""
        text = completion_text(completion)
        predicted = extract_answer(text, style)
        target = to_number(example["answer"])
        if predicted is not None and target is not None and to_number(predicted) == target:
            return 1.0
        return self.format_score if style == "chat" and has_think_answer_format(text) else 0.0

    def solution(self, example, style="compact"):
        if style == "compact":
            return example["answer"]
        return f"<think> {example['rationale']} </think> <answer> {example['answer']} </answer>"

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: column `answer` (the final number), one row per completion."""
        return rewards_from_columns(self.reward, completions, columns, ("answer",))


def _splits_from_datasets():
    try:
        import datasets  # optional: only for users who have it and are online
    except ImportError:
        raise ValueError("gsm8k needs data=PATH (JSONL rows with 'question' and 'answer', or a folder with "
                         "train.jsonl/test.jsonl), or the `datasets` package to fetch openai/gsm8k") from None
    try:
        loaded = datasets.load_dataset("openai/gsm8k", "main")
    except Exception as error:  # offline, hub down, ...: one clear line instead of a long traceback
        raise ValueError(f"gsm8k: could not load openai/gsm8k with `datasets` ({error}); pass data=PATH") from None
    splits = {}
    for split in ("train", "test"):
        splits[split] = []
        for i, row in enumerate(loaded[split]):
            try:
                splits[split].append(parse_row(row))
            except ValueError as error:
                raise ValueError(f"openai/gsm8k {split} row {i + 1}: {error}") from None
    return splits


def make_task(data=None, format_score=0.0):
    """Factory for get_task("gsm8k", data=PATH, format_score=0.0)."""
    if data is None:
        splits = _splits_from_datasets()
    else:
        splits = load_splits(data, ("question", "answer"), key="question", parse=parse_row)
    return GSM8KTask(splits=splits, format_score=float(format_score))
