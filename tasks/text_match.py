"""Text-similarity tasks (Poetry, MeetingBank style): non-verifiable, rewarded by overlap with a reference.

Data: rows {"prompt", "reference"} from data=PATH (a .jsonl or .parquet file, or a folder with train and test
files); a reference with no token left after normalisation is a data error. Reward (DESIGN.md §6, the official
SoftmaxGRPO similarity, rules="softmaxgrpo") = 0.6 * token F1 + 0.4 * ROUGE-L F, both on SQuAD-normalised tokens
(lower-case, punctuation and the articles a/an/the removed), written here in plain Python, of the chat
completion's final text (the official one: after the last </think>, its last <answer> block, else all of it) or
the whole compact completion. Bounds: both texts are cut to their first MAX_COMPARED_CHARS characters and both
token lists to their first MAX_COMPARED_TOKENS tokens before comparing (F1 and ROUGE-L are those of the cut
lists: what a completion writes past 4 096 tokens is not seen; a longer reference is compared on its start).
Optional format blend: reward = (1 - format_weight) * similarity + format_weight * [think/answer format met] (chat).
"""

import re
import string
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

from tasks._data import load_splits, sample_rows
from tasks._verify import check_rules, compact_text, completion_text, final_text, has_think_answer_format, \
    rewards_from_columns, text_prompt

F1_WEIGHT, ROUGE_WEIGHT = 0.6, 0.4
MAX_COMPARED_CHARS = 30_000  # a text is cut here before normalising (~5 000 English words)
MAX_COMPARED_TOKENS = 4_096  # both token lists are cut here: the LCS costs about len(a) * len(b) / 30 digit steps
RULES = ("softmaxgrpo",)
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
INSTRUCTION = ("Think inside <think> </think> tags, then write your final text inside <answer> </answer> "
               "tags.")


def normalize_tokens(text):
    """SQuAD normalisation: lower-case, drop punctuation, drop articles, split on whitespace."""
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split()


def compared_tokens(text):
    """The normalised tokens that are compared: text cut to MAX_COMPARED_CHARS, tokens to MAX_COMPARED_TOKENS."""
    return normalize_tokens(text[:MAX_COMPARED_CHARS])[:MAX_COMPARED_TOKENS]


@lru_cache(maxsize=4096)
def reference_tokens(reference):
    """compared_tokens of a reference (cached: the M completions of a prompt share it)."""
    return tuple(compared_tokens(reference))


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
    of the longer list; one big-integer update per token of the shorter list, so the cost is len(b) Python
    steps on len(a)-bit integers, and the match masks take (tokens of a also in b) * len(a) / 8 bytes."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    m, wanted = len(a), set(b)
    positions = defaultdict(list)
    for i, token in enumerate(a):
        if token in wanted:
            positions[token].append(i)
    match = {}
    for token, where in positions.items():
        bits = bytearray((m + 7) // 8)
        for i in where:
            bits[i >> 3] |= 1 << (i & 7)
        match[token] = int.from_bytes(bits, "little")
    full = (1 << m) - 1
    v = full
    for token in b:
        u = v & match.get(token, 0)
        if u:  # carries out of the low m bits never flow back down: mask once, at the end
            v = (v + u) | (v - u)
    return m - bin(v & full).count("1")


def rouge_l(prediction, reference):
    """ROUGE-L F-measure (beta = 1) between two token lists: harmonic mean of LCS/len(pred), LCS/len(ref)."""
    lcs = lcs_length(prediction, reference)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(prediction), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


def similarity(prediction_text, reference_text):
    """0.6 * token F1 + 0.4 * ROUGE-L F on the compared tokens (compared_tokens), in [0, 1]. A reference with no
    token raises ValueError (a data error: every answer would tie)."""
    prediction, reference = compared_tokens(prediction_text), list(reference_tokens(reference_text))
    if not reference:
        raise ValueError(f"text_match: the reference {reference_text[:40]!r} has no token after normalisation")
    return F1_WEIGHT * token_f1(prediction, reference) + ROUGE_WEIGHT * rouge_l(prediction, reference)


def parse_row(row):
    """Data check: the reference must keep at least one token after normalisation."""
    if not normalize_tokens(row["reference"]):
        raise ValueError("field 'reference' has no token after normalisation (punctuation and articles only)")
    return row


@dataclass
class TextMatchTask:
    """Text-similarity task object. format_weight: share of the reward
    given for the think/answer format (chat style); pass_threshold: similarity counted as a pass."""

    splits: dict = field(repr=False)
    format_weight: float = 0.0
    pass_threshold: float = 0.5
    rules: str = RULES[0]
    name: str = "text_match"

    def examples(self, split, n, seed):
        """Up to `n` rows of `split`, shuffled by seed (n=None: all)."""
        return [{"prompt": r["prompt"], "reference": r["reference"]}
                for r in sample_rows(self.splits, split, n, seed, "text_match")]

    def prompt(self, example, style="chat"):
        return text_prompt(example["prompt"], INSTRUCTION, style)

    def reward(self, completion, example, style="chat"):
        """Similarity of the final text (chat) or the whole completion (compact) to the reference, blended
        with the format check when format_weight > 0 (chat)."""
        text = completion_text(completion)
        if style == "compact":
            return similarity(text, example["reference"])
        score = similarity(final_text(text), example["reference"])
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


def make_task(data=None, format_weight=0.0, pass_threshold=0.5, rules=RULES[0]):
    """Factory for get_task("text_match", data=PATH, format_weight=0.0, pass_threshold=0.5, rules="softmaxgrpo")."""
    check_rules("text_match", rules, RULES)
    if data is None:
        raise ValueError("text_match needs data=PATH: a JSONL or parquet file of {\"prompt\", \"reference\"} rows "
                         "(or a folder with train and test files)")
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight must be in [0, 1], got {format_weight}")
    splits = load_splits(data, ("prompt", "reference"), key="prompt", parse=parse_row)
    return TextMatchTask(splits=splits, format_weight=float(format_weight), pass_threshold=float(pass_threshold),
                         rules=rules)
