"""Countdown: truth tables of both rule sets, the bounded parser, the solver and the generator (DESIGN.md §6)."""

import ast
import re
import warnings
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from tasks import COMPACT_ALPHABET, countdown, get_task
from tasks.countdown import MAX_PAREN_DEPTH, ParseError, official_is_correct, parse_equation, python_fraction, \
    solve, tokenize

EXAMPLE = {"numbers": [3, 5, 7], "target": 22}  # 3*5+7 = 22


def chat(answer):
    return f"<think> trying things </think> <answer> {answer} </answer>"


@pytest.fixture(scope="module")
def task():
    return get_task("countdown", rules="lenient")


@pytest.fixture(scope="module")
def task_with_format():
    return get_task("countdown", rules="lenient", format_score=0.1)


@pytest.fixture(scope="module")
def official():
    return get_task("countdown")  # rules="softmaxgrpo"


# --- official SoftmaxGRPO rules (the default) -----------------------------------------------------------
@pytest.mark.parametrize("completion, expected", [
    (chat("3*5+7"), 1.0),
    ("3*5+7", 1.0),                                     # bare text: no tags needed
    ("<think> so </think> 3*5+7", 1.0),                 # the text after the last </think>
    ("<answer> 3*5+7 </answer>", 1.0),
    ("<think> <answer>3*5+7</answer> </think> done", 0.0),  # an answer only inside <think> does not count
    ("<think> <answer>3*5+7</answer> </think>", 0.0),
    ("<answer>1+1</answer> <answer>3*5+7</answer>", 1.0),   # the last <answer> block
    ("<answer>3*5+7</answer> <answer>1+1</answer>", 0.0),
    ("<answer>3*5+7</answer> and so on", 1.0),          # a block wins over the text around it
    ("<answer> <answer>3*5+7</answer>", 0.0),           # blocks pair like re.findall: "<answer>3*5+7" is graded
    (chat("3 × 5 + 7"), 1.0),                           # × ÷ − are mapped
    (chat("(35 ÷ 5) + 3 × 5"), 0.0),                    # 22, but 35 is not given
    (chat("7 − 5 + 5 × 3 + 5"), 0.0),                   # 5 used twice
    (chat("\\boxed{3*5+7}"), 1.0),
    (chat("$\\boxed{3*5+7}$."), 1.0),
    (chat("\\boxed{\\text{3*5+7}}"), 0.0),          # only a \boxed{} without inner braces is unwrapped
    (chat("`3*5+7`"), 1.0),
    (chat("$3*5+7$"), 1.0),
    (chat("3*5+7."), 1.0),
    (chat("3*5+7 = 22"), 1.0),
    (chat("3*5+7 = 22.0"), 1.0),                        # the right-hand side is read as Fraction reads it
    (chat("3*5+7 = 44/2"), 1.0),
    (chat("3*5+7 = 2.2e1"), 1.0),
    (chat("3*5+7 = 23"), 0.0),
    (chat("3*5+7 = 22 = 22"), 0.0),                     # at most one "="
    (chat("3*5+7 == 22"), 0.0),
    (chat("3*5+7 ="), 0.0),
    (chat("3 * 5 + 7  # each number once"), 1.0),      # Python's grammar: a comment is ignored
    (chat("0x3*5+7"), 1.0),                             # ... and 0x3 is the integer 3
    (chat("3*5+7.0"), 0.0),                             # a float literal
    (chat("-3+5*5"), 0.0),                              # unary minus
    (chat("3*5+7*1"), 0.0),                             # 1 is not given
    (chat("3*5"), 0.0),                                 # 7 not used
    (chat("(3*5)+(7)"), 1.0),
    (chat("3**1*5+7"), 0.0),                            # ** is not + - * /
    (chat("The answer is 3*5+7"), 0.0),
    (chat(""), 0.0),
    (chat("3*5" + " " * 248 + "+7"), 1.0),              # 253 characters
    (chat("3*5" + " " * 252 + "+7"), 0.0),              # 257 characters: over the 256 bound
])
def test_countdown_official_truth_table(official, completion, expected):
    assert official.reward(completion, EXAMPLE) == expected


def test_countdown_official_exact_fractions_and_bounds(official):
    assert official.reward("6/(1-3/4)", {"numbers": [1, 3, 4, 6], "target": 24}) == 1.0
    assert official.reward("5/(3-3)", {"numbers": [3, 3, 5], "target": 10}) == 0.0  # division by zero
    # literals in 0..10^6 only: the same sum with 1 000 001 is refused
    assert official.reward("1000000-999999+21", {"numbers": [1000000, 999999, 21], "target": 22}) == 1.0
    assert official.reward("1000001-999999+20", {"numbers": [1000001, 999999, 20], "target": 22}) == 0.0


def test_python_fraction_reads_as_fraction_does_without_huge_powers():
    assert [python_fraction(text) for text in ("19", " 19.0 ", "19/1", "1.9e1", "190e-1")] == [19] * 5
    assert python_fraction("1_9") == 19 and python_fraction("+19") == 19
    assert python_fraction("1/0") is None and python_fraction("x") is None and python_fraction("") is None
    # 10**999999999 would take minutes: with a short mantissa such a number is 0 or no integer in 0..10^6
    assert python_fraction("0e999999999") == 0 and python_fraction("0.0e-999999999") == 0
    assert python_fraction("22e999999999") is None and python_fraction("22e-999999999") is None
    assert python_fraction("22e" + "9" * 250) is None


def test_countdown_compact_style_keeps_its_own_rules(official, task_with_format):
    official_with_format = get_task("countdown", format_score=0.1)
    for rules_task in (official_with_format, task_with_format):
        assert rules_task.reward("3*5+7", EXAMPLE, style="compact") == 1.0
        assert rules_task.reward("3*5-7", EXAMPLE, style="compact") == pytest.approx(0.1)
        assert rules_task.reward("3 × 5 + 7", EXAMPLE, style="compact") == 0.0
    assert official_with_format.reward(chat("3*5-7"), EXAMPLE) == 0.0  # the official chat rules are binary


def official_reference(text, numbers, target):
    """The official rules transcribed the slow, obvious way (regex extraction, ast walk) for the fuzz test."""
    text = text.replace("<|im_end|>", "").replace("<|endoftext|>", "").strip()
    text = text.rsplit("</think>", 1)[1].strip() if "</think>" in text else text
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    answer = (blocks[-1] if blocks else text).strip()
    answer = answer.replace("×", "*").replace("÷", "/").replace("−", "-")
    boxed = re.search(r"\\boxed\{([^{}]*)\}", answer)
    answer = (boxed.group(1) if boxed else answer).strip().strip("`$").strip().rstrip(".")
    sides = answer.split("=")
    if len(answer) > 256 or len(sides) > 2:
        return False
    try:
        if len(sides) == 2 and Fraction(sides[1].strip()) != target:
            return False
        used = []

        def value(node):
            if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 10**6:
                used.append(node.value)
                return Fraction(node.value)
            ops = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__,
                   ast.Div: Fraction.__truediv__}
            if isinstance(node, ast.BinOp) and type(node.op) in ops:
                return ops[type(node.op)](value(node.left), value(node.right))
            raise ValueError(node)

        with warnings.catch_warnings():  # Python warns about odd literals such as "1e1if"
            warnings.simplefilter("ignore")
            tree = ast.parse(sides[0].strip(), mode="eval")
        result = value(tree.body)
        return result == target and Counter(used) == Counter(numbers)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return False


PIECES = ["3", "5", "7", "22", "0x16", "0b11", "1_0", "00", "07", "*", "+", "-", "/", "(", ")", " ", "\n", "\r",
          "\t", "\\\n", "#", "# c", "=", "= 22", "=22.0", "=22/1", "=2.2e1", "×", "÷", "−", "`", "$", ".",
          "\\boxed{", "}", "{", "<answer>", "</answer>", "<think>", "</think>", "**", "x", "e", "1e1", "3.0", "'",
          "\\d", "if", "\u00a0", "\x85", "٣", "<|im_end|>", "3*5+7", "7+5*3", "(3*5)+7"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=12))
def test_countdown_official_rules_match_a_plain_transcription(pieces):
    # differences would come from the linear-time extraction, the character pre-check or the Fraction guard
    text = "".join(pieces)
    assert official_is_correct(text, [3, 5, 7], 22) == official_reference(text, [3, 5, 7], 22)


# --- lenient rules: our parser on the last <answer> block -----------------------------------------------
@pytest.mark.parametrize("answer, expected", [
    ("3*5+7", 1.0),            # correct
    ("7+5*3", 1.0),            # correct, other order (precedence: 5*3 first)
    ("(3*5)+7", 1.0),          # redundant parentheses are fine
    ("3*5+7 = 22", 1.0),       # "= target" suffix
    ("3*5+7=22", 1.0),
    ("3*5+7 = 23", 0.0),       # suffix claims a wrong target
    ("3*5-7", 0.0),            # wrong value (8)
    ("(3+5)*7", 0.0),          # wrong value (56)
    ("3*5+8", 0.0),            # wrong numbers
    ("3*7+1", 0.0),            # 22 but with a number not given, and 5 unused
    ("3*5+7+5-5", 0.0),        # reused number
    ("3*5", 0.0),              # a number left out
    ("3*5+7 is it", 0.0),      # extra text inside the answer
    ("-3+5*5", 0.0),           # unary minus is not in the grammar
    ("3.0*5+7", 0.0),          # decimals are not in the grammar
    ("3 × 5 + 7", 0.0),        # non-ASCII operator
    ("", 0.0),
])
def test_countdown_chat_truth_table(task, answer, expected):
    assert task.reward(chat(answer), EXAMPLE) == expected


def test_countdown_missing_tags_scores_zero_even_with_format_score(task, task_with_format):
    assert task.reward("3*5+7", EXAMPLE, style="chat") == 0.0
    assert task_with_format.reward("the answer is 3*5+7", EXAMPLE, style="chat") == 0.0
    assert task_with_format.reward("<answer> 3*5+7", EXAMPLE, style="chat") == 0.0  # unclosed tag


def test_countdown_format_score_tinyzero_style(task_with_format):
    # a present <answer> block that is wrong (or malformed) earns the format score, a right one earns 1
    assert task_with_format.reward(chat("3*5-7"), EXAMPLE) == pytest.approx(0.1)
    assert task_with_format.reward(chat("banana"), EXAMPLE) == pytest.approx(0.1)
    assert task_with_format.reward(chat("3*5+7"), EXAMPLE) == 1.0


def test_countdown_last_answer_block_is_graded(task):
    assert task.reward("<answer>1+1</answer> then <answer>3*5+7</answer>", EXAMPLE) == 1.0
    assert task.reward("<answer>3*5+7</answer> then <answer>1+1</answer>", EXAMPLE) == 0.0


def test_countdown_compact_whole_completion_is_the_answer(task, task_with_format):
    assert task.reward("3*5+7", EXAMPLE, style="compact") == 1.0
    assert task.reward(" 3*5+7\n", EXAMPLE, style="compact") == 1.0
    assert task.reward("3*5+7=22", EXAMPLE, style="compact") == 1.0
    assert task.reward("<answer>3*5+7</answer>", EXAMPLE, style="compact") == 0.0
    # compact format score: only for a parseable expression
    assert task_with_format.reward("3*5-7", EXAMPLE, style="compact") == pytest.approx(0.1)
    assert task_with_format.reward("3*5-", EXAMPLE, style="compact") == 0.0


def test_countdown_exact_fractions():
    # 6 / (1 - 3/4) = 24 needs a non-integer intermediate; floats would give 23.999... or 24.000...01
    task = get_task("countdown")
    assert task.reward(chat("6/(1-3/4)"), {"numbers": [1, 3, 4, 6], "target": 24}) == 1.0
    value, used, claimed = parse_equation("6/(1-3/4)")
    assert value == Fraction(24) and sorted(used) == [1, 3, 4, 6] and claimed is None


def test_countdown_division_by_zero_scores_zero(task):
    assert task.reward(chat("5/(3-3)"), {"numbers": [3, 3, 5], "target": 10}) == 0.0
    assert parse_equation("5/(3-3)")[0] is None


# --- bounded, whitelisted parser ------------------------------------------------------------------------
def test_tokenizer_rejects_non_ascii_digits_and_names():
    assert tokenize("12*(3+4)") == [12, "*", "(", 3, "+", 4, ")"]
    for text in ("٣+5", "３+5", "x+1", "__import__('os')", "2**3", "1e5"):
        with pytest.raises(ParseError):
            parse_equation(text)


def test_parser_depth_is_bounded():
    ok = "(" * MAX_PAREN_DEPTH + "1" + ")" * MAX_PAREN_DEPTH
    assert parse_equation(ok)[0] == 1
    too_deep = "(" + ok + ")"
    with pytest.raises(ParseError, match="deep"):
        parse_equation(too_deep)


def test_parser_length_is_bounded_before_tokenizing():
    with pytest.raises(ParseError, match="too long"):
        parse_equation("1+" * 150 + "1")  # 301 characters, well-formed otherwise


def test_parser_rejects_huge_literals():
    with pytest.raises(ParseError, match="literal"):
        parse_equation("9" * 50)


HOSTILE = ["__import__('os').system('echo pwned')", "9**9**9**9", "(" * 10_000 + "1" + ")" * 10_000,
           "1+" * 50_000 + "1", "x" * 100_000, "١٢*٥-٣", "3*5+7\x00", "eval('3*5+7')",
           "(" * 150 + "3*5+7" + ")" * 150, "\\boxed{" + "7" * 1_000_000, "<answer>" * 100_000,
           "3*5+7 = 22e" + "9" * 200]


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_countdown_hostile_inputs_score_zero_or_format(task_with_format, official, hostile):
    assert task_with_format.reward(hostile, EXAMPLE, style="compact") == 0.0
    assert task_with_format.reward(chat(hostile), EXAMPLE) == pytest.approx(0.1)
    assert task_with_format.reward(hostile, EXAMPLE, style="chat") == 0.0
    assert official.reward(chat(hostile), EXAMPLE) == official.reward(hostile, EXAMPLE) == 0.0


# --- solver and generator -------------------------------------------------------------------------------
def test_solver_finds_or_refuses():
    assert solve((1, 1, 1), 100) is None  # at most 3 from three ones
    expression = solve((25, 4, 3), 97)  # 25*4-3
    assert expression is not None
    value, used, _ = parse_equation(expression)
    assert value == 97 and sorted(used) == [3, 4, 25]


@pytest.mark.parametrize("num_count", [3, 4, (3, 4)])
def test_every_generated_problem_is_solved_by_its_own_solution(num_count):
    task = get_task("countdown", num_count=num_count)
    counts = {num_count} if isinstance(num_count, int) else set(num_count)
    for example in task.examples("train", 150, seed=1):
        assert len(example["numbers"]) in counts
        assert all(1 <= n <= 99 for n in example["numbers"]) and 10 <= example["target"] <= 100
        for style in ("compact", "chat"):
            assert task.reward(task.solution(example, style), example, style) == 1.0


def test_compact_prompt_and_solution_use_the_alphabet(task):
    example = {"numbers": [12, 5, 3], "target": 51}
    assert task.prompt(example, "compact") == "12 5 3>51:"
    for example in task.examples("train", 100, seed=2):
        text = task.prompt(example, "compact") + task.solution(example, "compact")
        assert set(text) <= set(COMPACT_ALPHABET) and " " not in task.solution(example)


def test_chat_prompt_is_think_answer_messages(task):
    messages = task.prompt(EXAMPLE, "chat")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "<answer>" in messages[0]["content"] and "[3, 5, 7]" in messages[1]["content"]


def test_examples_deterministic_distinct_and_splits_disjoint(task):
    first, again = task.examples("train", 200, seed=7), task.examples("train", 200, seed=7)
    assert first == again
    assert first != task.examples("train", 200, seed=8)
    key = lambda e: (tuple(sorted(e["numbers"])), e["target"])
    train = {key(e) for e in first}
    test = {key(e) for e in task.examples("test", 200, seed=7)}
    assert len(train) == 200 and len(test) == 200 and not train & test


def test_bad_options_raise():
    with pytest.raises(ValueError, match="num_count"):
        get_task("countdown", num_count=7)
    with pytest.raises(ValueError, match="data"):
        get_task("countdown", data="x.jsonl")
    with pytest.raises(ValueError, match="split"):
        get_task("countdown").examples("valid", 3, 0)


def test_examples_beyond_the_problem_space_is_an_error_not_a_hang(monkeypatch):
    # 2-number Countdown has only ~680 distinct test problems: asking for more must fail with a clear message,
    # once most of them are drawn (so 600 are there to ask for). 50 repeats in a row stand in for MAX_REPEATS:
    # its 2 000 take ~20 CPU seconds of draws here (1 in ~1 900 draws is a solvable test problem).
    monkeypatch.setattr(countdown, "MAX_REPEATS", 50)
    with pytest.raises(ValueError, match=r"only about \d+ distinct ones exist") as error:
        get_task("countdown", num_count=2).examples("test", 2000, seed=0)
    assert 600 <= int(str(error.value).split("only about ")[1].split()[0]) < 700


# ---------------------------------------------------------------------------------------------------------
# Data files: Countdown-Tasks-3to4 rows {nums, target} and verl rows (AR-Lopti's dict / SoftmaxGRPO's JSON truth).
import json  # noqa: E402

RENDERED = ("<|im_start|>system\nBe helpful.<|im_end|>\n<|im_start|>user\nUse [3, 5, 7] to make 22.<|im_end|>\n"
            "<|im_start|>assistant\nLet me solve this step by step.\n<think>")


def test_countdown_reads_nums_and_target_rows_with_the_official_holdout(tmp_path):
    path = tmp_path / "countdown.jsonl"
    path.write_text("".join(json.dumps({"nums": [i % 50 + 1, 3, 7], "target": i}) + "\n" for i in range(6_000)))
    task = get_task("countdown", data=str(path))
    assert len(task.splits["test"]) == 500 and len(task.splits["train"]) == 5_500  # min(500, 6000 // 10)
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"nums": [3, 5, 7], "target": t}) + "\n" for t in range(40)))
    task = get_task("countdown", data=str(small))
    assert len(task.splits["test"]) == 4  # at most a tenth of the distinct prompts
    example = {"numbers": [3, 5, 7], "target": 22}
    assert task.reward("<think> x </think> <answer> 3*5+7 </answer>", example) == 1.0
    assert task.prompt(example) == get_task("countdown").prompt(example)  # a plain row gets our prompt
    assert get_task("countdown").examples("train", 2, 0) == get_task("countdown").examples("train", 2, 0)


def test_countdown_verl_parquet_is_used_verbatim(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    messages = [{"role": "system", "content": "Think."}, {"role": "user", "content": "Use [3, 5, 7] for 22."}]
    rows = [  # AR-Lopti / TinyZero: a rendered prompt and a dict; SoftmaxGRPO: two messages and a JSON string
        {"target": 22, "nums": [3, 5, 7], "data_source": "countdown", "prompt": [{"content": RENDERED, "role": "user"}],
         "ability": "math", "reward_model": {"ground_truth": {"numbers": [3, 5, 7], "target": 22}, "style": "rule"},
         "extra_info": {"index": 0, "split": "train"}},
        {"target": 10, "nums": [2, 5], "data_source": "softmaxgrpo/countdown/exact", "prompt": messages, "ability": "math",
         "reward_model": {"ground_truth": json.dumps({"task": "countdown", "reward": "exact", "numbers": [2, 5],
                                                      "target": 10, "reference": ""}), "style": "rule"},
         "extra_info": {"index": 1, "split": "train"}},
    ]
    by_target = {}
    for i, row in enumerate(rows):  # one file each: a parquet column holds dicts or strings, not both
        path = tmp_path / f"train{i}.parquet"
        pandas.DataFrame([row]).to_parquet(path)
        task = get_task("countdown", data=str(path))
        assert len(task.splits["test"]) == 1 and not task.splits["train"]  # max(1, 1 // 10) held out
        by_target.update({e["target"]: e for e in task.splits["test"]})
    assert task.prompt(by_target[22]) == [{"role": "user", "content": RENDERED}]
    assert by_target[22]["rendered_prompt"] == RENDERED and by_target[22]["numbers"] == [3, 5, 7]
    assert task.prompt(by_target[10]) == messages and "rendered_prompt" not in by_target[10]
    assert task.reward("</think> <answer> 3*5+7 </answer>", by_target[22]) == 1.0
    assert task.reward("</think> <answer> 2*5 </answer>", by_target[10]) == 1.0
    assert task.reward("</think> <answer> 2+5 </answer>", by_target[10]) == 0.0


@pytest.mark.parametrize("row, message", [
    ({"nums": [3, "5"], "target": 8}, "field 'nums' item is not an integer"),
    ({"nums": [], "target": 8}, "field 'nums' is not a non-empty list"),
    ({"nums": [3, 5], "target": 8.5}, "field 'target' is not an integer"),
    ({"nums": [3, 5]}, "field 'target' missing"),
    ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": {"target": 3}}},
     "has no 'numbers' and 'target'"),
])
def test_countdown_malformed_rows_name_file_and_line(tmp_path, row, message):
    path = tmp_path / "countdown.jsonl"
    path.write_text(json.dumps({"nums": [3, 5], "target": 8}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError) as error:
        get_task("countdown", data=str(path))
    assert str(error.value).startswith(f"{path}:2: ") and message in str(error.value)
    assert "\n" not in str(error.value)
