"""GSM8K's lenient rules (last number) and loading; token F1, ROUGE-L and the text_match reward on hand-computed
examples, its bounds and its data checks. The math-verify rules are in test_tasks_math.py.

The text_match "official" numbers are the official SoftmaxGRPO rewards.py (similarity, format_score and the
OpenThoughts blend in compute_score, commit 088c87c) run on the same inputs: facts, not its code."""

import json
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from tasks import COMPACT_ALPHABET, get_task
from tasks.gsm8k import extract_answer, to_number
from tasks.text_match import LCS_CELLS, RULES, lcs_length, normalize_tokens, rouge_l, similarity, think_then_text, \
    token_f1


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


def test_gsm8k_folder_with_official_split(tmp_path, capsys):
    rows = gsm_rows(10)
    write_jsonl(tmp_path / "train.jsonl", rows[:8])
    write_jsonl(tmp_path / "test.jsonl", rows[6:])  # rows 6 and 7 overlap: dropped from train, and said so
    task = get_task("gsm8k", data=tmp_path, rules="last_number")
    assert len(task.examples("train", None, 0)) == 6 and len(task.examples("test", None, 0)) == 4
    assert f"note: {tmp_path}: 2 of 8 training rows repeat a test row's prompt" in capsys.readouterr().err
    write_jsonl(tmp_path / "train.jsonl", rows[:6])
    get_task("gsm8k", data=tmp_path, rules="last_number")
    assert "note:" not in capsys.readouterr().err  # nothing dropped, nothing said


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


def test_text_match_grades_the_final_text_of_the_reference_too(text_task, tmp_path):
    # the official similarity extracts the final text of both sides (official scores in the comments)
    wrapped = {"prompt": "p", "reference": "<think>…</think><answer>3+4</answer>"}
    assert text_task.reward("<answer>3+4</answer>", wrapped) == pytest.approx(1.0)  # official 1.0 (ours before: 0.0)
    example = {"prompt": "p", "reference": "<think> the cat sat </think> on the mat<|im_end|>"}
    assert text_task.reward("<answer> on mat </answer>", example) == pytest.approx(1.0)  # official 1.0
    example = {"prompt": "p", "reference": "<think> The cat sat on the mat? </think>\n\nThe cat sat on the mat."}
    assert text_task.reward("The cat sat on the mat.", example) == pytest.approx(1.0)  # official 1.0
    example = {"prompt": "p", "reference": "<answer>dog</answer> <answer>cat sat on mat</answer>"}
    assert text_task.reward("cat sat", example) == pytest.approx(2 / 3)  # official 0.6666666666666666
    # the warm-start targets are the reference's final text
    path = write_jsonl(tmp_path / "wrapped.jsonl", [{"prompt": f"q{i}", "reference": f"<think> t </think> line {i}"}
                                                    for i in range(20)])
    task = get_task("text_match", data=path)
    for example in task.examples("train", 3, 0):
        assert "<think> t" not in task.solution(example, "chat")
        assert task.reward(task.solution(example, "chat"), example) == pytest.approx(1.0)
        assert task.solution(example) == f"line {example['prompt'][1:]}"
    # a reference whose final text is empty is a data error (the official scores every completion 0.0 on it)
    path = write_jsonl(tmp_path / "thoughts.jsonl", [{"prompt": "p", "reference": "r"},
                                                    {"prompt": "q", "reference": "<think> only thoughts </think>"}])
    with pytest.raises(ValueError, match=f"^{path}:2: field 'reference' has no token after normalisation"):
        get_task("text_match", data=path)


def test_text_match_compares_long_texts_whole(text_task):
    reference = " ".join(f"r{i}" for i in range(500))
    # a 5 000-word completion: 4 500 other words, then the reference (ours before, cut to 4 096 tokens: 0.0)
    completion = " ".join(f"f{i}" for i in range(4500)) + " " + reference
    assert text_task.reward(completion, {"prompt": "p", "reference": reference}) == pytest.approx(0.18181818181818182)
    reference = " ".join(f"w{i}" for i in range(2000))
    huge = reference + " filler" * 150_000  # 1 MB: official 0.025974025974025976 = 2 * 2000 / 154000
    assert text_task.reward(huge, {"prompt": "p", "reference": reference}) == pytest.approx(0.025974025974025976)
    long_reference = " ".join(f"w{i}" for i in range(5000))
    assert text_task.reward(long_reference, {"prompt": "p", "reference": long_reference}) == pytest.approx(1.0)
    # order past 4 096 tokens counts: the reference's 300 words reversed after 4 000 fillers, official
    # 0.07843478260869564 (F1 0.13043478260869565, ROUGE-L 0.0004347826086956522)
    reversed_tail = "lorem " * 4000 + " ".join(f"w{i}" for i in range(299, -1, -1))
    example = {"prompt": "p", "reference": " ".join(f"w{i}" for i in range(300))}
    assert text_task.reward(reversed_tail, example) == pytest.approx(0.07843478260869564)


def test_text_match_one_megabyte_each_side_is_bounded():
    # 1 MB against 1 MB: the official (rapidfuzz, C) takes seconds; ours well under one (benchmarks/
    # task_generation.py); a generous bound here, the results checked against the official numbers
    mb = 1_000_000
    same = " ".join(f"w{i % 5000}" for i in range(mb // 7))
    cases = [(same, same, 1.0, 0.0),                                       # official 1.0 (common start: exact)
             ("x " * (mb // 2), "y " * (mb // 2), 0.0, 0.0),               # official 0.0 (nothing shared: exact)
             ("x y " * (mb // 4), "y x " * (mb // 4), 0.6 + 0.4 * (mb // 2 - 1) / (mb // 2), 1e-3)]  # LCS 2N - 1
    for prediction, reference, official, below in cases:
        started = time.perf_counter()
        score = similarity(prediction, reference)
        assert time.perf_counter() - started < 30
        assert official - below - 1e-12 <= score <= official + 1e-12  # past LCS_CELLS: a lower bound of ROUGE-L


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abcd"), max_size=25), st.lists(st.sampled_from("abcde"), max_size=25),
       st.integers(1, 40))
def test_lcs_past_its_budget_is_a_lower_bound(a, b, cells):
    exact = lcs_table(a, b)
    assert lcs_length(a, b, cells=cells) <= exact
    assert lcs_length(a, b, cells=max(len(a) * len(b), 1)) == exact
    assert lcs_length(a, b, cells=LCS_CELLS) == exact


@pytest.fixture
def openthoughts(tmp_path):
    rows = [{"prompt": f"Question {i}?", "reference": f"<think>\nLong reasoning {i}.\n</think>\n\nAnswer {i}."}
            for i in range(20)]
    return get_task("text_match", data=write_jsonl(tmp_path / "ot.jsonl", rows), rules="openthoughts")


@pytest.mark.parametrize("completion, official", [
    ("<think> plan </think> cat sat on mat", 1.0),
    ("<think> plan </think> <answer> cat sat on mat </answer>", 1.0),  # <answer> tags neither needed nor refused
    ("\n\n<think>\nplan\n</think>\n\ncat sat on hat\n", 0.8375),        # 0.65 * 0.75 + 0.35
    ("<think> plan </think> cat sat on mat<|im_end|>", 1.0),
    ("\u00a0<think> plan </think> cat sat on mat", 1.0),               # any Unicode white space before <think>
    ("<think> plan </think> dog", 0.35),
    ("cat sat on mat", 0.65),                                           # no think block
    ("<think> </think> cat sat on mat", 0.65),                          # an empty think block
    ("<think> plan </think>   ", 0.0),                                  # nothing after it
    ("<think> a </think> <think> b </think> cat sat on mat", 0.65),     # two think blocks
    ("intro <think> plan </think> cat sat on mat", 0.65),               # text before it
    ("plan </think> cat sat on mat", 0.65),                             # a pre-filled <think> is not assumed
    ("<think> plan </think> cat sat on mat </think>", 0.0),             # a second </think>: nothing after the last
])
def test_openthoughts_rules_are_the_official_reward(openthoughts, completion, official):
    # compute_score for task "openthoughts": 0.35 * format_score + 0.65 * similarity
    assert openthoughts.reward(completion, {"prompt": "p", "reference": "cat sat on mat"}) == pytest.approx(official)


def test_openthoughts_rules_options_and_prompt(openthoughts, text_task, tmp_path):
    assert RULES == ("softmaxgrpo", "openthoughts") and openthoughts.rules == "openthoughts"
    assert openthoughts.format_weight == 0.35 and text_task.format_weight == 0.0  # the default is unchanged
    assert text_task.reward("cat sat on mat", {"prompt": "p", "reference": "cat sat on mat"}) == pytest.approx(1.0)
    example = openthoughts.examples("train", 1, 0)[0]
    assert openthoughts.prompt(example) == [  # the official OpenThoughts prompt (prepare_data.py)
        {"role": "system", "content": "You are a helpful assistant. Think through the problem before providing the "
                                      "answer. Put your reasoning in <think> </think> tags, followed by your final "
                                      "answer."},
        {"role": "user", "content": example["prompt"]}]
    solution = openthoughts.solution(example, "chat")
    assert think_then_text(solution) and openthoughts.reward(solution, example) == pytest.approx(1.0)
    # OpenThoughts style reference: only its text after </think> is compared, official 1.0
    reference = "<think>\nLong reasoning here.\n</think>\n\nThe cat sat on the mat."
    assert openthoughts.reward("<think> plan </think> The cat sat on the mat.",
                               {"prompt": "p", "reference": reference}) == pytest.approx(1.0)
    half = get_task("text_match", data=tmp_path / "ot.jsonl", rules="openthoughts", format_weight=0.5)
    assert half.reward("<think> plan </think> dog", {"prompt": "p", "reference": "cat"}) == pytest.approx(0.5)
    assert openthoughts.reward("cat sat", {"prompt": "p", "reference": "cat sat"}, style="compact") == 1.0
    assert not think_then_text("<think>\t</think> x") and think_then_text(" <think>\ty\t</think>\tx ")
    with pytest.raises(ValueError, match="unknown rules 'poetry'"):
        get_task("text_match", data=tmp_path / "ot.jsonl", rules="poetry")
