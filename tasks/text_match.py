"""Text-similarity tasks (Poetry, MeetingBank, OpenThoughts): rewarded by overlap with a reference.

Data: rows {"prompt", "reference"} from data=PATH (JSONL or parquet, a file or a folder with train
and test files); a reference whose final text has no token left after normalisation is a data error.
Similarity (DESIGN.md §6, the official `similarity`) = 0.6 * token F1 + 0.4 * ROUGE-L F on
SQuAD-normalised tokens, between the final texts of the completion (compact style: the whole
completion) and of the reference, compared whole as the official code does. Rule sets (chat style):
`softmaxgrpo`, the similarity, blended with our think/answer check when format_weight > 0;
`openthoughts`, the official OpenThoughts reward and prompt, 0.65 * similarity + 0.35 *
think_then_text. ROUGE-L's LCS is exact up to LCS_CELLS cells after exact reductions, a lower bound
past that (lcs_length).
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
LCS_CELLS = 1 << 28  # exact LCS while len(a) * len(b) (after the exact reductions) stays within this
RULES = ("softmaxgrpo", "openthoughts")
FORMAT_WEIGHTS = {"softmaxgrpo": 0.0, "openthoughts": 0.35}  # format_weight when not given
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
INSTRUCTION = ("Think inside <think> </think> tags, then write your final text inside <answer> </answer> "
               "tags.")
OPENTHOUGHTS_SYSTEM_PROMPT = ("You are a helpful assistant. Think through the problem before providing the answer. "
                              "Put your reasoning in <think> </think> tags, followed by your final answer.")


def normalize_tokens(text):
    """SQuAD normalisation: lower-case, drop punctuation, drop articles, split on whitespace."""
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split()


@lru_cache(maxsize=256)
def reference_tokens(reference):
    """The normalised tokens of a reference's final text, as a tuple (cached: the M completions of a prompt share
    it)."""
    return tuple(normalize_tokens(final_text(reference)))


def token_f1(prediction, reference):
    """SQuAD token F1 between two token lists (bag-of-tokens overlap), 2 * shared / (len + len); two empty lists
    score 1."""
    if not prediction or not reference:
        return float(prediction == reference)
    same = sum((Counter(prediction) & Counter(reference)).values())
    return 2 * same / (len(prediction) + len(reference))


def _bit_parallel_lcs(a, b):
    """Exact LCS length of two token lists (Allison & Dix 1986, Hyyro 2004): bit i of V is 0 where
    the LCS "steps" at position i of the longer list; one big-int update per shorter-list token."""
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


def lcs_length(a, b, cells=LCS_CELLS):
    """Length of the longest common subsequence of two token lists: exact when, after dropping their common
    start and end and every token the other list lacks (both exact), the lengths multiply to at most `cells`;
    otherwise the sum over k aligned pieces (k = ceil(len * len / cells), piece i of each list is its i-th k-th),
    a lower bound of the LCS that costs about `cells` bit steps whatever the input."""
    a, b = list(a), list(b)
    shortest, start = min(len(a), len(b)), 0
    while start < shortest and a[start] == b[start]:
        start += 1
    end = 0
    while end < shortest - start and a[-1 - end] == b[-1 - end]:
        end += 1
    a, b = a[start:len(a) - end], b[start:len(b) - end]
    shared = set(a) & set(b)
    a, b = [t for t in a if t in shared], [t for t in b if t in shared]
    pieces = max(1, -(-len(a) * len(b) // cells))
    if pieces == 1:
        return start + end + _bit_parallel_lcs(a, b)
    cut_a = [len(a) * i // pieces for i in range(pieces + 1)]
    cut_b = [len(b) * i // pieces for i in range(pieces + 1)]
    return start + end + sum(_bit_parallel_lcs(a[cut_a[i]:cut_a[i + 1]], b[cut_b[i]:cut_b[i + 1]])
                             for i in range(pieces))


def rouge_l(prediction, reference):
    """ROUGE-L F-measure (beta = 1) between two token lists: 2 * LCS / (len + len), the harmonic mean of
    LCS/len(pred) and LCS/len(ref)."""
    if not prediction or not reference:
        return 0.0
    return 2 * lcs_length(prediction, reference) / (len(prediction) + len(reference))


def similarity(prediction_text, reference_text):
    """0.6 * token F1 + 0.4 * ROUGE-L F between the normalised tokens of `prediction_text` (as given) and those of
    the reference's final text, in [0, 1]. A reference with no token raises ValueError (a data error: every
    answer would tie)."""
    prediction, reference = normalize_tokens(prediction_text), reference_tokens(reference_text)
    if not reference:
        raise ValueError(f"text_match: the reference {reference_text[:40]!r} has no token after normalisation")
    return F1_WEIGHT * token_f1(prediction, reference) + ROUGE_WEIGHT * rouge_l(prediction, reference)


def think_then_text(text):
    """The official OpenThoughts format rule: exactly one <think> and one </think> in `text`, nothing but
    whitespace before the <think>, and something besides whitespace both inside the block and after it."""
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    body = text.lstrip()
    if not body.startswith("<think>"):
        return False
    inside, _, rest = body[len("<think>"):].partition("</think>")
    return bool(inside.strip() and rest.strip())


def parse_row(row):
    """Data check: the reference's final text must keep at least one token after normalisation."""
    if not reference_tokens(row["reference"]):
        raise ValueError("field 'reference' has no token after normalisation (its final text holds punctuation and "
                         "articles only)")
    return row


@dataclass
class TextMatchTask:
    """Text-similarity task object. rules: "softmaxgrpo" or "openthoughts" (module docstring); format_weight:
    share of the reward given for the format (chat style); pass_threshold: reward counted as a pass."""

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
        if style == "chat" and self.rules == "openthoughts":
            return [{"role": "system", "content": OPENTHOUGHTS_SYSTEM_PROMPT},
                    {"role": "user", "content": example["prompt"]}]
        return text_prompt(example["prompt"], INSTRUCTION, style)

    def reward(self, completion, example, style="chat"):
        """Similarity of the final text (chat) or the whole completion (compact) to the reference's final text,
        blended with the rule set's format check when format_weight > 0 (chat)."""
        text = completion_text(completion)
        if style == "compact":
            return similarity(text, example["reference"])
        score = similarity(final_text(text), example["reference"])
        if self.format_weight:
            met = think_then_text(text) if self.rules == "openthoughts" else has_think_answer_format(text)
            score = (1 - self.format_weight) * score + self.format_weight * met
        return score

    def solution(self, example, style="compact"):
        reference = final_text(example["reference"])
        if style == "compact":
            return compact_text(reference)
        return f"<think> Writing the reply. </think> <answer> {reference} </answer>"

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: column `reference`, one row per completion."""
        return rewards_from_columns(self.reward, completions, columns, ("reference",))


def make_task(data=None, format_weight=None, pass_threshold=0.5, rules=RULES[0]):
    """Factory for get_task("text_match", data=PATH, format_weight=None, pass_threshold=0.5, rules="softmaxgrpo");
    format_weight None: the rule set's (FORMAT_WEIGHTS: 0 for softmaxgrpo, the official 0.35 for openthoughts)."""
    check_rules("text_match", rules, RULES)
    if data is None:
        raise ValueError("text_match needs data=PATH: a JSONL or parquet file of {\"prompt\", \"reference\"} rows "
                         "(or a folder with train and test files)")
    if format_weight is None:
        format_weight = FORMAT_WEIGHTS[rules]
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight must be in [0, 1], got {format_weight}")
    splits = load_splits(data, ("prompt", "reference"), key="prompt", parse=parse_row)
    return TextMatchTask(splits=splits, format_weight=float(format_weight), pass_threshold=float(pass_threshold),
                         rules=rules)
