"""GSM8K and DeepMath under the official rules: math-verify on the final text (tasks/_math.py), its bounds and
its helper process, and DeepMath loading. math-verify comes from requirements-dev.txt."""

import json
import os
import subprocess
import sys
import threading

import pytest

from tasks import _math, get_task
from tasks.deepmath import HUB_NAME

pytest.importorskip("math_verify")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    rows = [{"question": f"Ann has {i} pens and buys 2 more. How many?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"}
            for i in range(40)]
    return get_task("gsm8k", data=write_jsonl(tmp_path_factory.mktemp("gsm") / "gsm8k.jsonl", rows))


@pytest.fixture(scope="module")
def deepmath(tmp_path_factory):
    rows = [{"question": f"Compute {i}/2.", "final_answer": f"\\frac{{{i}}}{{2}}", "difficulty": 1.0}
            for i in range(1, 41)]
    return get_task("deepmath", data=write_jsonl(tmp_path_factory.mktemp("deep") / "deepmath.jsonl", rows))


def q(answer):
    return {"question": "q", "answer": answer, "rationale": "r"}


@pytest.mark.parametrize("completion, gold, expected", [
    ("<think> 6*7 </think> <answer> 42 </answer>", "42", 1.0),
    ("<answer> \\boxed{\\frac{84}{2}} </answer>", "42", 1.0),
    ("<answer> \\boxed{\\frac{84}{2}} </answer>", "2", 0.0),    # last-number matching gave 2 here
    ("<answer> 1,2,3 </answer>", "123", 0.0),                   # ... and 123 here
    ("<answer> 1e3 </answer>", "3", 0.0),                       # ... and 3 here
    ("<answer> 1,000 </answer>", "1000", 1.0),
    ("<answer> 42.0 </answer>", "42", 1.0),
    ("So the total is $18$.", "18", 1.0),                       # bare text: the final text is all of it
    ("<think> it is 42 </think> I am not sure", "42", 0.0),     # an answer only inside <think> does not count
    ("<answer> 41 </answer>", "42", 0.0),
    ("", "42", 0.0),
])
def test_gsm8k_math_verify_truth_table(gsm8k, completion, gold, expected):
    assert gsm8k.rules == "math_verify"
    assert gsm8k.reward(completion, q(gold)) == expected


def test_gsm8k_compact_style_keeps_last_number(gsm8k):
    assert gsm8k.reward("the answer is 1,2,3", q("123"), style="compact") == 1.0  # the tiny model's own rules
    assert gsm8k.reward("42", q("42"), style="compact") == 1.0


def test_gsm8k_rules_options(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 1"}])
    with pytest.raises(ValueError, match="^gsm8k: format_score belongs to rules='last_number'"):
        get_task("gsm8k", data=path, format_score=0.1)
    monkeypatch.setitem(sys.modules, "math_verify", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"^gsm8k: rules='math_verify' needs the math-verify package"):
        get_task("gsm8k", data=path)
    with pytest.raises(ValueError, match=r"^deepmath: rules='math_verify' needs the math-verify package"):
        get_task("deepmath", data=path)
    assert get_task("gsm8k", data=path, rules="last_number").rules == "last_number"  # runs without it


HOSTILE = ["\\boxed{" + "7" * 1_000_000, "7" * 1_000_000, "{" * 100_000 + "42" + "}" * 100_000,
           "\\boxed{" * 100_000, "<answer>" * 100_000, "9**9**9**9", "$10^{10^{10}}$", "\\boxed{2^{2^{2^{99}}}}",
           "x" * 1_000_000 + " 41"]


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_math_hostile_inputs_are_handled(gsm8k, deepmath, hostile):
    # timing lives in benchmarks/task_generation.py; here: each returns 0 (and does not hang the suite)
    for completion in (hostile, f"<think> x </think> <answer> {hostile} </answer>"):
        assert gsm8k.reward(completion, q("42")) == 0.0
        assert deepmath.reward(completion, {"question": "q", "final_answer": "42"}) == 0.0


def test_a_long_final_text_is_parsed_from_its_last_box_or_its_end(gsm8k):
    assert gsm8k.reward("filler " * 10_000 + "so \\boxed{42}", q("42")) == 1.0
    # math-verify takes the last box wherever it is (official: 1); the window starts there, not at the text's end
    assert gsm8k.reward("\\boxed{72} " + "and some more words " * 100, q("72")) == 1.0
    assert gsm8k.reward("\\boxed{7} then \\boxed{72} " + "filler " * 200, q("7")) == 0.0  # the last box counts


def test_numbers_too_large_to_write_score_0_without_reaching_math_verify(gsm8k):
    # each of these cost 9-13 s (the deadline, then a helper restart); now the helper never sees them
    gsm8k.reward("<answer> 7 </answer>", q("7"))
    helper = _math.helper_process()
    for hostile in ("\\boxed{9^{999999999}}", "\\boxed{1000000!}", "\\boxed{\\binom{10^9}{5\\cdot 10^8}}",
                    "$\\sqrt{2}^{10^9}$", "9**9**9**9"):
        assert gsm8k.reward(hostile, q("42")) == 0.0
        assert _math.helper_process() is helper and helper.poll() is None  # not killed by a deadline
    # ... while powers that are numbers still are: official 1 (the old power-tower filter gave 0)
    assert gsm8k.reward("\\boxed{2^{2^3}}", q("256")) == 1.0
    assert gsm8k.reward("2**2**3", q("256")) == 1.0
    assert gsm8k.reward("\\boxed{\\binom{10^6}{3}}", q("166666166667000000")) == 1.0


@pytest.mark.parametrize("text,large", [
    ("9^{999999999}", True), ("1000000!", True), ("\\binom{10^9}{5\\cdot 10^8}", True), ("\\sqrt{2}^{10^9}", True),
    ("9**9**9", True), ("$10^{10^{10}}$", True), ("2^{400000}", True), ("30000!", True),
    ("2^{2^3}", False), ("2^{100}", False), ("(2^{10})^{3}", False), ("1^{10^{9}}", False), ("\\binom{100}{50}", False),
    ("5 \\cdot 10^{8}", False), ("x^{999999999}", False), ("42", False)])
def test_too_large_bounds_the_digits_from_the_literals(text, large):
    assert _math.too_large(text) is large


def test_helper_works_off_the_main_thread_and_survives_a_deadline(gsm8k, monkeypatch):
    results = []
    worker = threading.Thread(target=lambda: results.append(gsm8k.reward("<answer> 42 </answer>", q("42"))))
    worker.start()
    worker.join()
    assert results == [1.0]
    before = _math._helper["process"]
    monkeypatch.setattr(_math, "DEADLINE_S", 0.0)  # every answer is late: the helper is killed, the answer scores 0
    assert gsm8k.reward("<answer> 42 </answer>", q("42")) == 0.0
    assert before.poll() is not None and "process" not in _math._helper
    monkeypatch.setattr(_math, "DEADLINE_S", 5.0)
    assert gsm8k.reward("<answer> 42 </answer>", q("42")) == 1.0  # a new helper


def test_deepmath_rows_solutions_and_rewards(deepmath):
    train, test = deepmath.examples("train", None, 0), deepmath.examples("test", None, 0)
    assert len(train) + len(test) == 40 and test and set(train[0]) == {"question", "final_answer"}
    for example in train[:5]:
        assert deepmath.reward(deepmath.solution(example, "chat"), example) == 1.0
        assert deepmath.reward(deepmath.solution(example, "compact"), example, style="compact") == 1.0
    example = {"question": "q", "final_answer": "\\frac{3}{2}"}
    assert deepmath.reward("<answer> 1.5 </answer>", example) == 1.0
    assert deepmath.reward("<answer> $\\frac{6}{4}$ </answer>", example) == 1.0
    assert deepmath.reward("<answer> 3/2 </answer>", example) == 1.0
    assert deepmath.reward("<answer> 2/3 </answer>", example) == 0.0
    assert deepmath.reward("frac 3 2", example, style="compact") == 1.0
    assert deepmath.reward("", {"question": "q", "final_answer": "∞"}, style="compact") == 0.0  # compacts to ""


def test_deepmath_data_errors(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match=r"^deepmath needs data=PATH"):
        get_task("deepmath")  # nothing is downloaded unless asked for
    with pytest.raises(ValueError, match=f"^deepmath: data='{HUB_NAME}' needs the `datasets` package"):
        get_task("deepmath", data=HUB_NAME)
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "final_answer": "1"}, {"question": "q2"}])
    with pytest.raises(ValueError, match=f"^{path}:2: field 'final_answer' missing or not a string$"):
        get_task("deepmath", data=path)
    path = write_jsonl(tmp_path / "e.jsonl", [{"question": "q", "final_answer": "  "}])
    with pytest.raises(ValueError, match=f"^{path}:1: field 'question' or 'final_answer' is empty$"):
        get_task("deepmath", data=path)


def test_deepmath_reads_parquet_shards(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    shards = tmp_path / "DeepMath-103K" / "data"
    shards.mkdir(parents=True)
    for shard in range(2):  # the hub snapshot's layout: data/train-0000k-of-00002.parquet
        rows = [{"question": f"Compute {shard}{i}/2.", "final_answer": f"{shard}{i}/2", "topic": "x"}
                for i in range(20)]
        pandas.DataFrame(rows).to_parquet(shards / f"train-0000{shard}-of-00002.parquet")
    task = get_task("deepmath", data=tmp_path / "DeepMath-103K")
    assert len(task.examples("train", None, 0)) + len(task.examples("test", None, 0)) == 40


# --- answer_style: our <think>/<answer> prompt ("tags", default) or the official SoftmaxGRPO \boxed{} prompt --------
OFFICIAL_ASK = "put your final answer within \\boxed{}"  # the key phrase of the official GSM8K / DeepMath prompt


@pytest.fixture(scope="module")
def styled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("styled")
    gsm = write_jsonl(folder / "g.jsonl", [{"question": f"Ann has {i} pens and buys 2 more. How many?",
                                            "answer": f"{i}+2={i + 2}\n#### {i + 2}"} for i in range(20)])
    deep = write_jsonl(folder / "d.jsonl", [{"question": f"Compute {i}/2.", "final_answer": f"\\frac{{{i}}}{{2}}"}
                                            for i in range(1, 21)])
    return {(name, style): get_task(name, data=path, answer_style=style)
            for name, path in (("gsm8k", gsm), ("deepmath", deep)) for style in ("tags", "boxed")}


@pytest.mark.parametrize("name", ["gsm8k", "deepmath"])
def test_tags_style_prompt_asks_for_think_and_answer_tags(styled, name):
    task = styled[name, "tags"]
    assert task.answer_style == "tags"
    example = task.examples("train", 1, 0)[0]
    system, user = task.prompt(example, "chat")
    assert "<think>" in system["content"] and "<answer>" in user["content"]
    assert user["content"].startswith(example["question"] + "\n")
    assert task.reward(task.solution(example, "chat"), example) == 1.0


@pytest.mark.parametrize("name", ["gsm8k", "deepmath"])
def test_boxed_style_prompt_is_the_official_one(styled, name):
    task, tags = styled[name, "boxed"], styled[name, "tags"]
    example = task.examples("train", 1, 0)[0]
    messages = task.prompt(example, "chat")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].startswith(example["question"] + "\n") and OFFICIAL_ASK in messages[1]["content"]
    assert "step by step" in messages[1]["content"] and "Think through the problem" in messages[0]["content"]
    assert not any(tag in m["content"] for m in messages for tag in ("<answer>", "<think>"))
    assert task.prompt(example, "compact") == tags.prompt(example, "compact")  # the tiny model's prompt is unchanged
    solution = task.solution(example, "chat")
    assert "\\boxed{" in solution and "<answer>" not in solution and task.reward(solution, example) == 1.0


# The official reward (math-verify on the final text) whatever the prompt asked: the same score under both styles.
@pytest.mark.parametrize("completion, expected", [
    ("6 times 7 is 42, so the answer is \\boxed{42}.", 1.0),
    ("$\\boxed{42}$<|im_end|>", 1.0),
    ("The answer is 42.", 1.0),                                  # no box: the plain expression is read
    ("\\boxed{41}", 0.0),
    ("The answer is \\boxed{41}, i.e. 42", 0.0),                 # the box is read first
    ("First \\boxed{41}. Wait, no: \\boxed{42}", 0.0),           # two boxes: math-verify reads the set {41, 42}
    ("<think> \\boxed{42} </think> so 41", 0.0),                 # only the text after </think> counts
    ("", 0.0),
])
def test_gsm8k_boxed_style_reward_reads_the_boxed_answer(styled, completion, expected):
    example = q("42")
    assert styled["gsm8k", "boxed"].reward(completion, example) == expected
    assert styled["gsm8k", "tags"].reward(completion, example) == expected


def test_deepmath_boxed_style_reward(styled):
    example = {"question": "q", "final_answer": "\\frac{3}{2}"}
    task = styled["deepmath", "boxed"]
    for completion, expected in [("So the answer is \\boxed{\\frac{3}{2}}.", 1.0), ("\\boxed{1.5}", 1.0),
                                 ("\\boxed{3/2}", 1.0), ("\\boxed{\\frac{2}{3}}", 0.0), ("The answer is 3/2.", 1.0)]:
        assert task.reward(completion, example) == expected
        assert styled["deepmath", "tags"].reward(completion, example) == expected


def test_gsm8k_last_number_format_score_follows_the_answer_style(styled, tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 1"}])
    boxed = get_task("gsm8k", data=path, rules="last_number", format_score=0.1, answer_style="boxed")
    tags = get_task("gsm8k", data=path, rules="last_number", format_score=0.1)
    in_box, in_tags = "so \\boxed{41}", "<think> x </think> <answer> 41 </answer>"
    assert (boxed.reward(in_box, q("42")), boxed.reward(in_tags, q("42"))) == (0.1, 0.0)  # the asked-for form
    assert (tags.reward(in_box, q("42")), tags.reward(in_tags, q("42"))) == (0.0, 0.1)
    assert boxed.reward("First \\boxed{41}. Wait, no: \\boxed{42}", q("42")) == 1.0  # ours: the last box


def test_unknown_answer_style_raises(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 1", "final_answer": "1"}])
    for name in ("gsm8k", "deepmath"):
        assert get_task(name, data=path).answer_style == "tags"  # the default: our generated-data prompt
        with pytest.raises(ValueError, match=f"^{name}: unknown answer_style 'latex'; choose from 'tags', 'boxed'$"):
            get_task(name, data=path, answer_style="latex")


# The official code pins math-verify 0.8.0; requirements-dev.txt installs a newer one. The one answer rule known to
# differ: a percent sign. `\boxed{72\%}` against gold 72 scores 0 under 0.8.0 (72\% parses as 72/100) and 1 under
# 0.9.0. .ci/run installs 0.8.0 into .math-verify-0.8 (MATH_VERIFY_08) so that both are checked.
PERCENT = ("\\boxed{72\\%}", "72")


def test_a_percent_answer_under_the_installed_math_verify(gsm8k):
    from importlib.metadata import version
    newer = tuple(int(part) for part in version("math-verify").split(".")[:2]) >= (0, 9)
    assert gsm8k.reward(PERCENT[0], q(PERCENT[1])) == (1.0 if newer else 0.0)


def test_a_percent_answer_under_the_official_math_verify_0_8(tmp_path):
    folder = os.environ.get("MATH_VERIFY_08", os.path.join(REPO, ".math-verify-0.8"))
    if not os.path.isdir(os.path.join(folder, "math_verify")):
        pytest.skip("math-verify 0.8.0 not installed: pip install --target .math-verify-0.8 math-verify==0.8.0")
    data = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": f"x\n#### {i}"} for i in range(20)])
    code = ("import sys, json; from importlib.metadata import version; from tasks import get_task; "
            f"task = get_task('gsm8k', data={str(data)!r}); "
            f"print(version('math-verify'), task.reward({PERCENT[0]!r}, {{'question': 'q', 'answer': '72', "
            "'rationale': ''}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, REPO])}  # the helper process inherits it
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["0.8.0", "0.0"]


# ---------------------------------------------------------------------------------------------------------
# Data files in verl's format (SoftmaxGRPO prepare_data.py / verl's gsm8k) and DeepMath's official held-out size.
import hashlib  # noqa: E402

from tasks._verify import math_prompt  # noqa: E402


def softmaxgrpo_row(task, question, answer):
    messages = [{"role": "system", "content": "Sys."}, {"role": "user", "content": f"{question}\nBox it."}]
    return {"data_source": f"softmaxgrpo/{task}/exact", "prompt": messages,
            "reward_model": {"style": "rule", "ground_truth": json.dumps({"task": task, "reward": "exact",
                                                                          "answer": answer, "reference": answer})},
            "extra_info": {"id": question, "task": task, "reward": "exact"}}


@pytest.mark.parametrize("name", ["gsm8k", "deepmath"])
def test_verl_parquet_prompts_are_verbatim_and_rewarded_on_the_answer(tmp_path, name):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    folder = tmp_path / f"{name}_exact"  # prepare_data.py writes train.parquet and validation.parquet
    folder.mkdir()
    pandas.DataFrame([softmaxgrpo_row(name, f"What is {i} + 1?", str(i + 1)) for i in range(5)]).to_parquet(
        folder / "train.parquet")
    pandas.DataFrame([softmaxgrpo_row(name, "What is 41 + 1?", "42")]).to_parquet(folder / "validation.parquet")
    task = get_task(name, data=str(folder), answer_style="boxed")
    assert len(task.splits["train"]) == 5 and len(task.splits["test"]) == 1
    example = task.examples("test", 1, 0)[0]
    assert task.prompt(example) == softmaxgrpo_row(name, "What is 41 + 1?", "42")["prompt"]  # no system of ours
    assert task.reward("The answer is \\boxed{42}.", example) == 1.0
    assert task.reward("The answer is \\boxed{41}.", example) == 0.0


def test_verl_plain_string_ground_truth_is_the_answer(tmp_path):
    path = tmp_path / "gsm8k.jsonl"  # verl's own gsm8k preprocessing: ground_truth is the final number
    write_jsonl(path, [{"prompt": [{"role": "user", "content": f"Q{i}? Let's think step by step."}],
                        "reward_model": {"style": "rule", "ground_truth": str(i)}} for i in range(20)])
    task = get_task("gsm8k", data=str(path))
    example = (task.splits["train"] + task.splits["test"])[0]
    assert task.prompt(example) == [{"role": "user", "content": f"Q{example['answer']}? Let's think step by step."}]
    assert task.reward(f"\\boxed{{{example['answer']}}}", example) == 1.0
    write_jsonl(path, [{"prompt": [{"role": "user", "content": "Q"}], "reward_model": {"ground_truth": ""}}])
    with pytest.raises(ValueError, match=rf"^{path}:1: reward_model.ground_truth has no answer string$"):
        get_task("gsm8k", data=str(path))


def test_deepmath_single_file_holds_out_1000_prompts_as_prepare_data(tmp_path):
    path = tmp_path / "deepmath.jsonl"
    write_jsonl(path, [{"question": f"Compute {i} + 1.", "final_answer": str(i + 1)} for i in range(10_500)])
    task = get_task("deepmath", data=str(path))
    assert len(task.splits["test"]) == 1000 and len(task.splits["train"]) == 9_500
    small = tmp_path / "small.jsonl"
    write_jsonl(small, [{"question": f"Compute {i} + 1.", "final_answer": str(i + 1)} for i in range(50)])
    task = get_task("deepmath", data=str(small))
    # the ids prepare_data.py gives these rows: sha256 of its boxed prompt's messages, ranked with seed 42
    ids = {hashlib.sha256(json.dumps(math_prompt(f"Compute {i} + 1.", "", "chat", "boxed"), sort_keys=True)
                          .encode()).hexdigest(): i for i in range(50)}
    ranked = sorted(ids, key=lambda uid: hashlib.sha256(f"42:{uid}".encode()).digest())[:5]
    assert sorted(r["question"] for r in task.splits["test"]) == sorted(f"Compute {ids[u]} + 1." for u in ranked)
