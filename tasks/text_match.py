"""Text-similarity tasks (Poetry, MeetingBank style): non-verifiable, rewarded by overlap with a reference.

Data: JSONL rows {"prompt", "reference"} from data=PATH (a .jsonl file or a folder with train.jsonl and
test.jsonl). Reward (DESIGN.md §6) = 0.6 * token F1 + 0.4 * ROUGE-L F, both on SQuAD-normalised tokens
(lower-case, punctuation and the articles a/an/the removed), written here in plain Python. Optional format
blend: reward = (1 - format_weight) * similarity + format_weight * [think/answer format met] (chat only).
"""

import re
import string
from collections import Counter
from dataclasses import dataclass, field

from tasks._data import load_splits, sample_rows
from tasks._verify import answer_region, chat_messages, compact_text, completion_text, \
    has_think_answer_format, rewards_from_columns

F1_WEIGHT, ROUGE_WEIGHT = 0.6, 0.4
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_tokens(text):
    """SQuAD normalisation: lower-case, drop punctuation, drop articles, split on whitespace."""
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split()


def token_f1(prediction, reference):
    """SQuAD token F1 between two token lists (bag-of-tokens overlap); two empty lists score 1."""
    if not prediction or not reference:
        return float(prediction == reference)
    same = sum((Counter(prediction) & Counter(reference)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(reference)
    return 2 * precision * recall / (precision + recall)


def lcs_length(a, b):
    """Length of the longest common subsequence of two token lists.

    Bit-parallel LCS (Allison & Dix 1986, Hyyro 2004): bit i of V is 0 where the LCS "steps" at position i
    of the longer list; one big-integer update per token of the shorter list, so a 50 000-token completion
    against a short reference costs as many Python steps as the reference has tokens."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    m, wanted = len(a), set(b)
    rows = {token: bytearray(b"0" * m) for token in wanted}
    for i, token in enumerate(a):
        row = rows.get(token)
        if row is not None:
            row[m - 1 - i] = ord("1")  # bit i, written most-significant first for int(..., 2)
    match = {token: int(row, 2) for token, row in rows.items()}
    full = (1 << m) - 1
    v = full
    for token in b:
        u = v & match[token]
        v = ((v + u) | (v - u)) & full
    return m - bin(v).count("1")


def rouge_l(prediction, reference):
    """ROUGE-L F-measure (beta = 1) between two token lists: harmonic mean of LCS/len(pred), LCS/len(ref)."""
    lcs = lcs_length(prediction, reference)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(prediction), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


def similarity(prediction_text, reference_text):
    """0.6 * token F1 + 0.4 * ROUGE-L F on SQuAD-normalised tokens, in [0, 1]."""
    prediction, reference = normalize_tokens(prediction_text), normalize_tokens(reference_text)
    return F1_WEIGHT * token_f1(prediction, reference) + ROUGE_WEIGHT * rouge_l(prediction, reference)


@dataclass
class TextMatchTask:
    """Text-similarity task object (interface in notes/interfaces.md). format_weight: share of the reward
    given for the think/answer format (chat style); pass_threshold: similarity counted as a pass."""

    splits: dict = field(repr=False)
    format_weight: float = 0.0
    pass_threshold: float = 0.5
    name: str = "text_match"

    def examples(self, split, n, seed):
        """Up to `n` rows of `split`, shuffled by seed (n=None: all)."""
        return [{"prompt": r["prompt"], "reference": r["reference"]}
                for r in sample_rows(self.splits, split, n, seed, "text_match")]

    def prompt(self, example, style="chat"):
        if style == "compact":
            return compact_text(example["prompt"]) + ":"
        if style != "chat":
            raise ValueError(f"style must be 'chat' or 'compact', got {style!r}")
        return chat_messages(f"{example['prompt']}\nThink inside <think> </think> tags, then write your final "
                             "text inside <answer> </answer> tags.")

    def reward(self, completion, example, style="chat"):
        """Similarity of the answer region (chat) or the whole completion (compact) to the reference, blended
        with the format check when format_weight > 0 (chat)."""
        text = completion_text(completion)
        if style == "compact":
            return similarity(text, example["reference"])
        score = similarity(answer_region(text), example["reference"])
        if self.format_weight:
            score = (1 - self.format_weight) * score + self.format_weight * has_think_answer_format(text)
        return score

    def solution(self, example, style="compact"):
        if style == "compact":
            return compact_text(example["reference"])
        return f"<think> Writing the reply. </think> <answer> {example['reference']} </answer>"

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: column `reference`, one row per completion."""
        return rewards_from_columns(self.reward, completions, columns, ("reference",))


def make_task(data=None, format_weight=0.0, pass_threshold=0.5):
    """Factory for get_task("text_match", data=PATH, format_weight=0.0, pass_threshold=0.5)."""
    if data is None:
        raise ValueError("text_match needs data=PATH: a JSONL file of {\"prompt\", \"reference\"} rows "
                         "(or a folder with train.jsonl and test.jsonl)")
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight must be in [0, 1], got {format_weight}")
    splits = load_splits(data, ("prompt", "reference"), key="prompt")
    return TextMatchTask(splits=splits, format_weight=float(format_weight), pass_threshold=float(pass_threshold))
