"""Countdown: combine 3 or 4 given integers with + - * / into an expression that equals a target.

Generator, verifiers and rule sets: DESIGN.md §6. `softmaxgrpo` (default) is the official reward
(official_is_correct: Python's grammar through ast.parse only, nothing is run); `lenient` is our
whitelisted recursive-descent parser (parse_equation) with an optional format_score, which the
compact style always uses. Model output is never evaluated as Python. Data file (data=PATH; the
generator is the default): rows {"nums": [ints], "target": int} (Jiayi-Pan/Countdown-Tasks-3to4) or
verl rows (ground_truth {"target", "numbers"}), JSONL or parquet (tasks/_data.py); a single file
holds out at most HOLDOUT prompts as SoftmaxGRPO's prepare_data.py does.
"""

import ast
import json
import operator
import random
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction

from tasks._data import load_splits, sample_rows
from tasks.countdown_solver import solve

from tasks._verify import chat_messages, check_rules, completion_text, final_text, last_tag_block, \
    rewards_from_columns

MAX_ANSWER_CHARS = 200  # longer answers are rejected before tokenizing
MAX_PAREN_DEPTH = 16  # deeper nesting is rejected by the parser
MAX_NUMBER_DIGITS = 6  # integer literals with more digits are rejected
NUMBER_RANGE = (1, 99)
TARGET_RANGE = (10, 100)
MAX_REPEATS = 2_000  # consecutive duplicate draws before examples() gives up
TEST_EVERY = 10  # a problem belongs to the test split when crc32(problem) % TEST_EVERY == 0
RULES = ("softmaxgrpo", "lenient")  # chat-style rule sets, default first
OFFICIAL_MAX_CHARS, OFFICIAL_MAX_INT = 256, 10**6  # official rules: answer length, integer literals in 0..10^6
HOLDOUT = 500  # held-out prompts of a single data file (prepare_data.py's --validation-size default)
OFFICIAL_MAX_SCAN = 50_000  # ours: a longer final text scores 0 unread (a 1 024-token response has ~4 000)

# Generator: random numbers and target, kept when the solver (tasks/countdown_solver.py) finds an expression.
def generate(rng, num_counts, split):
    """One solvable problem {"numbers", "target"} from `rng` that belongs to `split` (train/test by hash)."""
    while True:
        count = rng.choice(num_counts)
        numbers = [rng.randint(*NUMBER_RANGE) for _ in range(count)]
        target = rng.randint(*TARGET_RANGE)
        in_test = zlib.crc32(repr((sorted(numbers), target)).encode()) % TEST_EVERY == 0
        if in_test != (split == "test"):
            continue
        if solve(tuple(numbers), target) is not None:
            return {"numbers": numbers, "target": target}


# Verifier: whitelisted tokenizer + recursive-descent parser over exact Fractions.
class ParseError(ValueError):
    """The answer is not a well-formed equation of the allowed grammar."""


def tokenize(text):
    """Integers and the characters + - * / ( ) =, ASCII only; whitespace is skipped. Anything else raises."""
    tokens, i = [], 0
    while i < len(text):
        c = text[i]
        if c in " \t\n":
            i += 1
        elif c in "+-*/()=":
            tokens.append(c)
            i += 1
        elif "0" <= c <= "9":  # explicit ASCII range: str.isdigit() would accept '٣'
            j = i
            while j < len(text) and "0" <= text[j] <= "9":
                j += 1
            if j - i > MAX_NUMBER_DIGITS:
                raise ParseError("integer literal too long")
            tokens.append(int(text[i:j]))
            i = j
        else:
            raise ParseError(f"character {c!r} not allowed")
    return tokens


def parse_equation(text):
    """Parse "expr" or "expr = integer" -> (value: Fraction or None on division by zero, numbers used: list,
    claimed right-hand side: int or None). Grammar: expr := term (+|- term)*, term := factor (*|/ factor)*,
    factor := integer | ( expr ). Raises ParseError on anything else, on answers longer than
    MAX_ANSWER_CHARS and on parentheses nested deeper than MAX_PAREN_DEPTH."""
    if len(text) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    tokens = tokenize(text)
    pos = 0
    used = []

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def factor(depth):
        nonlocal pos
        token = peek()
        if isinstance(token, int):
            pos += 1
            used.append(token)
            return Fraction(token)
        if token == "(":
            if depth >= MAX_PAREN_DEPTH:
                raise ParseError("parentheses nested too deep")
            pos += 1
            value = expr(depth + 1)
            if peek() != ")":
                raise ParseError("missing ')'")
            pos += 1
            return value
        raise ParseError(f"unexpected token {token!r}")

    def term(depth):
        nonlocal pos
        value = factor(depth)
        while peek() in ("*", "/"):
            op = tokens[pos]
            pos += 1
            right = factor(depth)
            if value is None or right is None or (op == "/" and right == 0):
                value = None  # division by zero: keep parsing, the answer is well-formed but worth nothing
            else:
                value = value * right if op == "*" else value / right
        return value

    def expr(depth):
        nonlocal pos
        value = term(depth)
        while peek() in ("+", "-"):
            op = tokens[pos]
            pos += 1
            right = term(depth)
            value = None if value is None or right is None else value + right if op == "+" else value - right
        return value

    value = expr(0)
    claimed = None
    if peek() == "=":
        pos += 1
        claimed = peek()
        if not isinstance(claimed, int):
            raise ParseError("'=' must be followed by an integer")
        pos += 1
    if pos != len(tokens):
        raise ParseError(f"unexpected token {peek()!r}")
    return value, used, claimed


def is_correct(answer, numbers, target):
    """True when `answer` parses, uses exactly the multiset `numbers`, and equals `target` (and so does its
    optional "= n" suffix). Raises ParseError when the answer is malformed."""
    value, used, claimed = parse_equation(answer)
    return (sorted(used) == sorted(numbers) and value is not None and value == target
            and (claimed is None or claimed == target))


# The official SoftmaxGRPO rules: Python's own grammar (0x10, 1_000, a trailing "# comment"),
# through ast.parse only (a syntax tree: nothing is run); the walk accepts ints and + - * / nodes.
_ACCEPTABLE_CODE = frozenset("0123456789abcdefABCDEFxXoObB_+-*/() \t\n\r\f\\")  # all an accepted answer can hold
_FLAT_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_EXPONENT = re.compile(r"[eE]([-+]?\d+(?:_\d+)*)\s*\Z")
_OPERATIONS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def official_answer(text):
    """The string the official rules grade: final_text with × ÷ − mapped to * / -, the first \\boxed{...} without
    inner braces unwrapped, surrounding backticks and $ and trailing dots stripped; "" for a final text over
    OFFICIAL_MAX_SCAN characters (the official code would search it for a \\boxed{}: ~25 ms per MB)."""
    answer = final_text(text)
    if len(answer) > OFFICIAL_MAX_SCAN:
        return ""
    answer = answer.replace("×", "*").replace("÷", "/").replace("−", "-")
    boxed = _FLAT_BOXED.search(answer)
    return (boxed.group(1) if boxed else answer).strip().strip("`$").strip().rstrip(".")


def python_fraction(text):
    """Fraction(text) as Python reads a string ("19", " 19.0 ", "19/1", "1.9e1"), or None if not a number. Beyond
    an exponent of +-1000 a mantissa of <= 256 characters gives 0 or no integer in 0..10^6 (None): 10**e is skipped."""
    match = _EXPONENT.search(text)
    try:
        if match and abs(int(match.group(1))) > 1000:
            mantissa = Fraction(text[:match.start(1)] + "0")
            return Fraction(0) if mantissa == 0 else None
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def python_arithmetic(text):
    """(value, integers used) of `text` read as a Python expression made of int literals in 0..10^6, binary
    + - * / and parentheses; None for anything else and for a division by zero."""
    text = text.strip()
    code = "\n".join(line.split("#", 1)[0] for line in re.split(r"[\r\n]", text))  # a comment may hold anything
    if not set(code) <= _ACCEPTABLE_CODE:
        return None  # could not be accepted: skip the parser (and its SyntaxWarnings on odd strings)
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    used = []

    def value(node):  # depth <= 128 nodes: at most 256 characters
        if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= OFFICIAL_MAX_INT:
            used.append(node.value)
            return Fraction(node.value)
        if not (isinstance(node, ast.BinOp) and type(node.op) in _OPERATIONS):
            raise ValueError("not allowed")
        return _OPERATIONS[type(node.op)](value(node.left), value(node.right))

    try:
        return value(tree), used
    except (ValueError, ZeroDivisionError):
        return None


def official_is_correct(text, numbers, target):
    """The official SoftmaxGRPO Countdown check: official_answer() has <= 256 characters and <= 1 "="; the part
    after it, if any, is a python_fraction equal to the target ("19.0", "19/1" count); the part before is
    python_arithmetic whose exact value is the target and whose integers are the given multiset."""
    answer = official_answer(text)
    if len(answer) > OFFICIAL_MAX_CHARS or answer.count("=") > 1:
        return False
    left, _, right = answer.partition("=")
    if "=" in answer and python_fraction(right.strip()) != int(target):
        return False
    parsed = python_arithmetic(left)
    return (parsed is not None and parsed[0] == int(target)
            and Counter(parsed[1]) == Counter(int(n) for n in numbers))


# Data files.
def _integer(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is not an integer: {value!r}")
    return value


def file_problem(numbers, target, names=("nums", "target")):
    """Example {"numbers", "target"} from a data row's values; ValueError naming the field when malformed."""
    if not isinstance(numbers, list) or not numbers:
        raise ValueError(f"field '{names[0]}' is not a non-empty list of integers")
    return {"numbers": [_integer(n, f"field '{names[0]}' item") for n in numbers],
            "target": _integer(target, f"field '{names[1]}'")}


def parse_row(row):
    """A {"nums", "target"} row (Countdown-Tasks-3to4) -> example {"numbers", "target"}."""
    return file_problem(row["nums"], row["target"])


def from_verl(truth, messages):
    """A verl-format row -> example {"numbers", "target"} from ground_truth {"target", "numbers"}."""
    if not isinstance(truth, dict) or "numbers" not in truth or "target" not in truth:
        raise ValueError("reward_model.ground_truth has no 'numbers' and 'target'")
    return file_problem(truth["numbers"], truth["target"], ("ground_truth.numbers", "ground_truth.target"))


def row_key(row):
    """The held-out key of a plain row: its numbers and target."""
    return json.dumps([row["numbers"], row["target"]])


@dataclass
class CountdownTask:
    """Countdown task object. num_counts: how many numbers a problem may have (each draws one);
    rules: RULES; format_score: a well-formed wrong answer's reward (compact and lenient only)."""

    num_counts: tuple = (3, 4)
    format_score: float = 0.0
    rules: str = RULES[0]
    name: str = "countdown"
    pass_threshold: float = 1.0
    compact_wording: str = 'the numbers, ">", the target, ":"; the completion is the expression'  # the step page's
    splits: dict = field(default=None, repr=False)  # a data file's rows; None: the generator

    def examples(self, split, n, seed):
        """`n` distinct solvable problems, deterministic in (split, seed); train and test never share one. With a
        data file: up to `n` of its rows of `split`, shuffled by seed."""
        if self.splits is not None:
            return [dict(row) for row in sample_rows(self.splits, split, n, seed, "countdown")]
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"countdown-{split}-{seed}")
        out, seen, repeats = [], set(), 0
        while len(out) < n:
            problem = generate(rng, self.num_counts, split)
            key = (tuple(sorted(problem["numbers"])), problem["target"])
            if key in seen:
                repeats += 1  # a long run of repeats means the split has no more distinct problems
                if repeats > MAX_REPEATS:
                    raise ValueError(f"countdown: asked for n={n} {split} problems with num_count="
                                     f"{self.num_counts}, but only about {len(out)} distinct ones exist")
                continue
            seen.add(key)
            out.append(problem)
            repeats = 0
        return out

    def prompt(self, example, style="chat"):
        numbers, target = example["numbers"], example["target"]
        if style == "compact":
            return " ".join(str(n) for n in numbers) + f">{target}:"
        if style != "chat":
            raise ValueError(f"style must be 'chat' or 'compact', got {style!r}")
        if "messages" in example:  # a verl-format file's prompt, verbatim
            return [dict(message) for message in example["messages"]]
        return chat_messages(
            f"Using the numbers {list(numbers)}, write an equation that equals {target}. You may use +, -, * "
            "and / with parentheses, and every number must be used exactly once. Reason inside <think> "
            "</think> tags, then give only the equation inside <answer> </answer> tags, for example "
            "<answer> (1 + 2) * 3 </answer>.")

    def reward(self, completion, example, style="chat"):
        """1.0 for a correct equation, else 0.0 (chat, rules="softmaxgrpo": official_is_correct). Otherwise
        format_score for a well-formed wrong one (lenient chat: any <answer> block, as in TinyZero; compact: a
        parseable expression)."""
        text = completion_text(completion)
        if style == "chat" and self.rules == "softmaxgrpo":
            return 1.0 if official_is_correct(text, example["numbers"], example["target"]) else 0.0
        answer = text.strip() if style == "compact" else last_tag_block(text)
        if answer is None:
            return 0.0
        try:
            correct = is_correct(answer, example["numbers"], example["target"])
        except ParseError:
            return 0.0 if style == "compact" else self.format_score
        return 1.0 if correct else self.format_score

    def solution(self, example, style="compact"):
        """A correct completion, from the depth-first solver (the warm-start target)."""
        expression = solve(tuple(example["numbers"]), example["target"])
        if expression is None:
            raise ValueError(f"countdown example has no solution: {example}")
        if style == "compact":
            return expression
        return f"<think> {expression} = {example['target']} </think> <answer> {expression} </answer>"

    def reward_fn(self, completions, **columns):
        """TRL GRPOTrainer reward function: columns `numbers` and `target`, one row per completion."""
        return rewards_from_columns(self.reward, completions, columns, ("numbers", "target"))


def make_task(data=None, num_count=(3, 4), format_score=0.0, rules=RULES[0]):
    """Factory for get_task("countdown", data=None | PATH, num_count=(3, 4) | 3 | 4 | 2, format_score=0.0,
    rules="softmaxgrpo")."""
    counts = (num_count,) if isinstance(num_count, int) else tuple(num_count)
    if not counts or any(c not in (2, 3, 4) for c in counts):
        raise ValueError(f"num_count must be 2, 3, 4 or a tuple of those such as (3, 4), got {num_count!r}")
    rules = check_rules("countdown", rules, RULES)
    splits = None if data is None else load_splits(data, (), key=row_key, parse=parse_row, columns=("nums", "target"),
                                                   verl=from_verl, holdout=HOLDOUT)
    return CountdownTask(num_counts=counts, format_score=float(format_score), rules=rules, splits=splits)
