"""DeepMath: competition-style math problems with a LaTeX final answer (DeepMath-103K, as in SoftmaxGRPO).

Data: rows {"question", "final_answer"} (other columns, such as the R1 solutions, are ignored) from data=PATH
(a .jsonl or .parquet file, a folder with train and test files, or a folder of the hub snapshot's parquet
shards), or data="zwhe99/DeepMath-103K" to load it with the `datasets` package (never by default: nothing is
downloaded unless asked for). The hub data has one split: 1 000 held-out prompts, as SoftmaxGRPO's README runs
prepare_data.py (--validation-size 1000; at most a tenth of the distinct prompts), ranked by the hash of the
official boxed prompt's messages as there, so the same questions (tasks/_data.py ranked_holdout). A file in
verl's format (`prompt` messages, `reward_model.ground_truth`: SoftmaxGRPO's JSON {"answer", ...} or a plain
answer string) is used verbatim: the chat prompt is the file's messages, whatever answer_style says; a folder
holding prepare_data.py's train.parquet and validation.parquet keeps its split.
Verifier, chat style (rules="math_verify", the only one): the official SoftmaxGRPO check, math-verify on the
completion's final text against the boxed final answer (tasks/_math.py); binary.
Compact style (tiny char model): the completion, compacted, must equal the compacted final answer.
Chat prompt, by `answer_style`: "tags" (default; ours) asks for <think> reasoning and the boxed answer in an
<answer> block; "boxed" is the official SoftmaxGRPO prompt (reason step by step, final answer within \\boxed{};
no tags). The reward is the same under both: math-verify reads the final text whatever the prompt asked.
"""

import json
import os
from dataclasses import dataclass, field

from tasks._data import last_user_text, load_splits, ranked_holdout, sample_rows, truth_answer
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
    try:
        import datasets  # optional: only for users who have it and are online
    except ImportError:
        raise ValueError(f"deepmath: data={HUB_NAME!r} needs the `datasets` package; or pass data=PATH") from None
    try:
        loaded = datasets.load_dataset(HUB_NAME, split="train")
    except Exception as error:  # offline, hub down, ...: one clear line instead of a long traceback
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"deepmath: could not load {HUB_NAME} with `datasets` ({first_line}); "
                         "pass data=PATH") from None
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
