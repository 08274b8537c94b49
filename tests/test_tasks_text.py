"""GSM8K's lenient rules (last number) and loading; token F1, ROUGE-L and the text_match reward on hand-computed
examples, its bounds and its data checks. The math-verify rules are in test_tasks_math.py."""

import json
import sys

import pytest
from hypothesis import given, settings, strategies as st

from tasks import COMPACT_ALPHABET, get_task
from tasks.gsm8k import extract_answer, to_number
from tasks.text_match import MAX_COMPARED_CHARS, MAX_COMPARED_TOKENS, compared_tokens, lcs_length, \
    normalize_tokens, rouge_l, similarity, token_f1


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def gsm_rows(count):
    return [{"question": f"Ann has {i} pens and buys 2 more. How many pens does she have?",
             "answer": f"She has {i}+2=<<{i}+2={i + 2}>>{i + 2} pens.\n#### {i + 2:,}"} for i in range(count)]


@pytest.fixture
def gsm8k(tmp_path):
    return get_task("gsm8k", data=write_jsonl(tmp_path / "gsm8k.jsonl", gsm_rows(60)), rules="last_number")


# --- GSM8K ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, expected", [
    ("<think> 6*7 </think> <answer> 42 </answer>", "42"),
    ("<answer> \\boxed{1,000} </answer>", "1,000"),
    ("so it is \\boxed{18} dollars for 3 items", "18"),                 # \boxed beats the last number
    ("<answer> She pays $12.50 in total </answer>", "12.50"),
    ("First 3 then 4, so 7.", "7"),                                     # last number without tags
    ("<answer> 5 </answer> and afterwards 9", "5"),                     # the answer block wins
    ("a \\boxed{\\frac{1}{2}} b", "2"),                                 # nested braces stay balanced
    ("no numbers here", None),
    ("<answer> ٤٢ </answer>", None),                                    # non-ASCII digits are not numbers
])
def test_gsm8k_extraction(completion, expected):
    assert extract_answer(completion) == expected


def test_last_number_far_from_the_end_and_across_the_scan_window():
    assert extract_answer("the answer is 17" + " words" * 500) == "17"  # more than 1000 characters later
    long_number = "9" * 30 + "12"
    assert extract_answer("x" * 2000 + long_number + "y" * 985) == long_number  # straddles the last 1000


@pytest.mark.parametrize("text, value", [("1,000", 1000), ("$1000", 1000), ("1000.0", 1000), ("-3", -3),
                                         ("12.50", 12.5), ("abc", None), ("1e3", None), ("9" * 100, None)])
def test_gsm8k_number_normalisation(text, value):
    assert to_number(text) == value


def test_gsm8k_reward_and_format_score(gsm8k, tmp_path):
    example = {"question": "q", "answer": "1000", "rationale": "r"}
    assert gsm8k.reward("<think> x </think> <answer> 1,000 </answer>", example) == 1.0
    assert gsm8k.reward("<think> x </think> <answer> $1000.00 </answer>", example) == 1.0
    assert gsm8k.reward("<think> x </think> <answer> 999 </answer>", example) == 0.0
    assert gsm8k.reward("1000", example, style="compact") == 1.0
    with_format = get_task("gsm8k", data=tmp_path / "gsm8k.jsonl", format_score=0.1, rules="last_number")
    assert with_format.reward("<think> x </think> <answer> 999 </answer>", example) == pytest.approx(0.1)
    assert with_format.reward("999", example) == 0.0


def test_gsm8k_rows_parse_and_solutions_score(gsm8k):
    train, test = gsm8k.examples("train", None, seed=0), gsm8k.examples("test", None, seed=0)
    assert len(train) + len(test) == 60 and test and not {e["question"] for e in train} & {e["question"] for e in test}
    for example in train[:10]:
        assert "<<" not in example["rationale"] and "," not in example["answer"]
        assert gsm8k.reward(gsm8k.solution(example, "chat"), example) == 1.0
        assert gsm8k.reward(gsm8k.solution(example, "compact"), example, style="compact") == 1.0
        assert set(gsm8k.prompt(example, "compact") + gsm8k.solution(example)) <= set(COMPACT_ALPHABET)
    assert gsm8k.examples("train", 5, seed=3) == gsm8k.examples("train", 5, seed=3)
    assert gsm8k.examples("train", 5, seed=3) != gsm8k.examples("train", 5, seed=4)


def test_gsm8k_folder_with_official_split(tmp_path):
    rows = gsm_rows(10)
    write_jsonl(tmp_path / "train.jsonl", rows[:8])
    write_jsonl(tmp_path / "test.jsonl", rows[6:])  # rows 6 and 7 overlap: dropped from train
    task = get_task("gsm8k", data=tmp_path, rules="last_number")
    assert len(task.examples("train", None, 0)) == 6 and len(task.examples("test", None, 0)) == 4


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "not valid JSON"),
    ('{"question": "q"}', "field 'answer'"),
    ('{"question": "q", "answer": "no final line"}', "####"),
    ('{"question": "q", "answer": "x #### many"}', "not a number"),
    ('[1, 2]', "JSON object"),
])
def test_gsm8k_malformed_file_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(gsm_rows(1)[0]) + "\n\n" + bad_line + "\n")
    with pytest.raises(ValueError, match=message) as error:
        get_task("gsm8k", data=path, rules="last_number")
    assert f"{path}:3:" in str(error.value)


def test_gsm8k_without_data_or_datasets_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ValueError, match="data=PATH"):
        get_task("gsm8k", rules="last_number")  # nothing is downloaded unless asked for
    with pytest.raises(ValueError, match=r"^gsm8k: data='openai/gsm8k' needs the `datasets` package"):
        get_task("gsm8k", data="openai/gsm8k", rules="last_number")
    with pytest.raises(ValueError, match="cannot open"):
        get_task("gsm8k", data=tmp_path / "missing.jsonl", rules="last_number")


def test_gsm8k_boxed_scan_is_bounded():
    assert extract_answer("\\boxed{" + "{" * 1_000_000) is None  # unclosed within 1000 characters
    assert extract_answer("7 \\boxed{" + "x" * 10_000) == "7"  # falls back to the last number ...
    assert extract_answer("7 \\boxed{" + "x" * 1_000_000) is None  # ... in the last 20 000 characters
    assert extract_answer("\\boxed{" + "x " * 400 + "12}") == "12"


# --- token F1 and ROUGE-L -------------------------------------------------------------------------------
def test_squad_normalisation():
    assert normalize_tokens("The Cat, sat on A mat!") == ["cat", "sat", "on", "mat"]


def test_f1_and_rouge_by_hand():
    pred, ref = normalize_tokens("the cat sat on the mat"), normalize_tokens("a cat sat on a hat")
    # 3 shared tokens of 4 each: P = R = 3/4; LCS = "cat sat on" = 3 -> same 3/4
    assert token_f1(pred, ref) == pytest.approx(0.75)
    assert rouge_l(pred, ref) == pytest.approx(0.75)
    assert similarity("the cat sat on the mat", "a cat sat on a hat") == pytest.approx(0.75)
    # order matters to ROUGE-L only: bag overlap 3/3, LCS of (z y x) vs (x y z) is 1
    assert token_f1(["z", "y", "x"], ["x", "y", "z"]) == 1.0
    assert rouge_l(["z", "y", "x"], ["x", "y", "z"]) == pytest.approx(1 / 3)
    assert similarity("z y x", "x y z") == pytest.approx(0.6 + 0.4 / 3)
    assert similarity("c b a", "a b c") == pytest.approx(0.6 + 0.4 / 2)  # "a" is an article: (c b) vs (b c)
    # unequal lengths: pred 2 tokens, ref 4, both shared in order: P = 1, R = 1/2, F = 2/3
    assert rouge_l(["x", "y"], ["x", "q", "y", "z"]) == pytest.approx(2 / 3)
    # repeated tokens count once per occurrence in F1: pred (x x x) vs ref (x y): same = 1, P 1/3, R 1/2
    assert token_f1(["x", "x", "x"], ["x", "y"]) == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert token_f1([], []) == 1.0 and token_f1([], ["x"]) == 0.0 and rouge_l([], ["x"]) == 0.0


def lcs_table(a, b):
    """Textbook O(len(a) * len(b)) dynamic programme, the reference for the bit-parallel version."""
    row = [0] * (len(b) + 1)
    for x in a:
        new = [0]
        for j, y in enumerate(b):
            new.append(row[j] + 1 if x == y else max(row[j + 1], new[j]))
        row = new
    return row[-1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abcd"), max_size=25), st.lists(st.sampled_from("abcde"), max_size=25))
def test_bit_parallel_lcs_matches_dynamic_programme(a, b):
    assert lcs_length(a, b) == lcs_table(a, b) == lcs_length(b, a)


def test_lcs_of_long_lists_is_exact_and_cheap():
    a = ["x", "y"] * 4000 + ["z"]
    b = ["y", "x"] * 2500
    assert lcs_length(a, b) == 5000 and lcs_length(b, a) == 5000  # every token of b in order in a
    assert lcs_length(["q"] * 9000, b) == 0


# --- text_match task ------------------------------------------------------------------------------------
@pytest.fixture
def text_task(tmp_path):
    rows = [{"prompt": f"Write line {i} of the poem.", "reference": f"Roses number {i} are red, violets are blue."}
            for i in range(40)]
    return get_task("text_match", data=write_jsonl(tmp_path / "poems.jsonl", rows))


def test_text_match_reward_and_format_blend(text_task, tmp_path):
    example = {"prompt": "p", "reference": "the cat sat on the mat"}
    completion = "<think> hmm </think> <answer> a cat sat on a hat </answer>"
    assert text_task.reward(completion, example) == pytest.approx(0.75)
    assert text_task.reward("cat sat on mat", example, style="compact") == pytest.approx(1.0)
    blended = get_task("text_match", data=tmp_path / "poems.jsonl", format_weight=0.2)
    assert blended.reward("<think> x </think> <answer> cat sat on mat </answer>", example) == pytest.approx(1.0)
    assert blended.reward("cat sat on mat", example) == pytest.approx(0.8)  # no tags: no format share


def test_text_match_examples_and_solutions(text_task):
    train, test = text_task.examples("train", None, 0), text_task.examples("test", None, 0)
    assert len(train) + len(test) == 40 and not {e["prompt"] for e in train} & {e["prompt"] for e in test}
    for example in train[:5]:
        assert text_task.reward(text_task.solution(example, "chat"), example) == pytest.approx(1.0)
        assert text_task.reward(text_task.solution(example), example, style="compact") == pytest.approx(1.0)
        assert set(text_task.prompt(example, "compact") + text_task.solution(example)) <= set(COMPACT_ALPHABET)


def test_text_match_needs_data_and_reports_bad_lines(tmp_path):
    with pytest.raises(ValueError, match="data=PATH"):
        get_task("text_match")
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "p", "reference": "r"}\n{"prompt": "p2", "reference": 3}\n')
    with pytest.raises(ValueError, match=f"{path}:2: field 'reference'"):
        get_task("text_match", data=path)


def test_text_match_reference_without_tokens_is_a_data_error(tmp_path, text_task):
    # before: the empty reference tied every empty answer at 0.6 (two empty bags have F1 = 1)
    rows = [{"prompt": "p", "reference": "r"}, {"prompt": "q", "reference": "The, a!"}]
    path = write_jsonl(tmp_path / "empty.jsonl", rows)
    with pytest.raises(ValueError, match=f"^{path}:2: field 'reference' has no token after normalisation"):
        get_task("text_match", data=path)
    with pytest.raises(ValueError, match="no token after normalisation"):
        text_task.reward("<answer> </answer>", {"prompt": "p", "reference": "an ..."})


def test_text_match_grades_the_official_final_text(text_task):
    example = {"prompt": "p", "reference": "cat sat on mat"}
    assert text_task.reward("<think> cat sat on mat </think> dog", example) == 0.0   # only after </think>
    assert text_task.reward("<think> x </think> cat sat on mat", example) == pytest.approx(1.0)  # no tags needed
    assert text_task.reward("<answer> cat sat on mat </answer> dog", example) == pytest.approx(1.0)


def test_text_match_bounds_what_it_compares(text_task):
    reference = " ".join(f"w{i}" for i in range(2000))  # 2 000 distinct tokens
    example = {"prompt": "p", "reference": reference}
    # a 1 MB completion: the reference then filler, cut to the first 4 096 tokens: 2 000 of them shared, in order,
    # so F1 = ROUGE-L F = 2 * 2000 / (4096 + 2000)
    huge = reference + " filler" * 150_000
    assert text_task.reward(huge, example) == pytest.approx(2 * 2000 / (MAX_COMPARED_TOKENS + 2000))
    long_reference = " ".join(f"w{i}" for i in range(5000))  # compared on its first 4 096 tokens
    assert text_task.reward(long_reference, {"prompt": "p", "reference": long_reference}) == pytest.approx(1.0)
    assert len(compared_tokens("x " * 60_000)) == MAX_COMPARED_TOKENS
    assert len(compared_tokens("abcdefghij " * 10_000)) == MAX_COMPARED_CHARS // 11 + 1  # the cut splits a word
