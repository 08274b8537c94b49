"""The task registry, the shared interface every task offers, the TRL-style wrapper and hostile completions."""

import dataclasses
import inspect
import json
import pathlib
import re

import pytest

import tasks
from tasks import COMPACT_ALPHABET, TASKS, get_task

TASKS_DIR = pathlib.Path(tasks.__file__).parent


@pytest.fixture
def all_tasks(tmp_path):
    pytest.importorskip("math_verify")  # the math tasks' default rules (requirements-dev.txt installs it)
    gsm = tmp_path / "gsm8k.jsonl"
    gsm.write_text("".join(json.dumps({"question": f"What is {i} plus 1?", "answer": f"{i}+1\n#### {i + 1}"}) + "\n"
                           for i in range(30)))
    deep = tmp_path / "deepmath.jsonl"
    deep.write_text("".join(json.dumps({"question": f"What is {i}/7 in lowest terms?",
                                        "final_answer": f"\\frac{{{i}}}{{7}}"}) + "\n" for i in range(1, 31)))
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"prompt": f"Say {i}.", "reference": f"number {i} said"}) + "\n"
                            for i in range(30)))
    return [get_task("countdown"), get_task("knights_knaves"), get_task("gsm8k", data=gsm),
            get_task("deepmath", data=deep), get_task("text_match", data=text)]


def test_registry_names_and_errors():
    assert set(TASKS) == {"countdown", "knights_knaves", "gsm8k", "deepmath", "text_match"}
    with pytest.raises(ValueError, match=r"unknown task 'chess'; choose from countdown, deepmath, gsm8k"):
        get_task("chess")
    with pytest.raises(ValueError, match="no option"):
        get_task("countdown", temperature=1.0)


def test_rules_names_defaults_and_errors():
    # the official rule set is each task's default; the names below are the documented interface
    assert tasks.RULES == {"countdown": ("softmaxgrpo", "lenient"), "knights_knaves": ("logic_rl", "lenient"),
                           "gsm8k": ("math_verify", "last_number"), "deepmath": ("math_verify",),
                           "text_match": ("softmaxgrpo", "openthoughts")}
    assert get_task("countdown").rules == get_task("countdown", rules="softmaxgrpo").rules == "softmaxgrpo"
    assert get_task("knights_knaves").rules == get_task("knights_knaves", rules="logic_rl").rules == "logic_rl"
    assert get_task("countdown", rules="lenient").rules == "lenient"
    assert get_task("knights_knaves", rules="lenient").rules == "lenient"
    with pytest.raises(ValueError) as error:
        get_task("countdown", rules="official")
    assert str(error.value) == "countdown: unknown rules 'official'; choose from 'softmaxgrpo', 'lenient'"
    with pytest.raises(ValueError, match=r"^knights_knaves: unknown rules 'softmaxgrpo'; choose from 'logic_rl'"):
        get_task("knights_knaves", rules="softmaxgrpo")
    for name in ("gsm8k", "deepmath", "text_match"):  # checked before the data is looked at
        with pytest.raises(ValueError, match=f"^{name}: unknown rules 'x'"):
            get_task(name, rules="x")


def test_compact_alphabet_is_small_and_sorted():
    assert COMPACT_ALPHABET == "".join(sorted(set(COMPACT_ALPHABET)))
    assert set("0123456789+-*/()=>:,. abcdefghijklmnopqrstuvwxyz") <= set(COMPACT_ALPHABET)
    assert len(COMPACT_ALPHABET) <= 50 and COMPACT_ALPHABET.isascii()


def test_every_task_offers_the_interface(all_tasks):
    for task in all_tasks:
        assert task.name in TASKS and isinstance(task.pass_threshold, float) and task.rules in tasks.RULES[task.name]
        train, test = task.examples("train", 4, seed=0), task.examples("test", 2, seed=0)
        assert len(train) == 4 and len(test) == 2
        for example in train:
            json.dumps(example)  # flat, JSON-able: usable as dataset columns
            assert isinstance(task.prompt(example, "compact"), str)
            messages = task.prompt(example, "chat")
            assert [m["role"] for m in messages] == ["system", "user"]
            assert set(task.prompt(example, "compact") + task.solution(example, "compact")) <= set(COMPACT_ALPHABET)
            assert task.reward(task.solution(example, "chat"), example) >= task.pass_threshold
            assert task.reward(task.solution(example, "compact"), example, style="compact") >= task.pass_threshold
        with pytest.raises(ValueError, match="style"):
            task.prompt(train[0], "markdown")


def test_prompt_style_options_default_to_our_prompts(all_tasks):
    from rollout import assistant_prefill
    # no task pre-fills the assistant's turn unless asked (knights_knaves think_prefill=true: "<think>")
    assert [assistant_prefill(task) for task in all_tasks] == [""] * len(all_tasks)
    assert assistant_prefill(get_task("knights_knaves", think_prefill=True)) == "<think>"
    # the math tasks ask for <think>/<answer> tags unless answer_style="boxed" (the official \boxed{} prompt)
    math = [task for task in all_tasks if task.name in ("gsm8k", "deepmath")]
    assert [task.answer_style for task in math] == ["tags", "tags"]
    for task in math:
        example = task.examples("train", 1, seed=0)[0]
        official = dataclasses.replace(task, answer_style="boxed")  # as get_task(..., answer_style="boxed") builds it
        assert "<answer>" in task.prompt(example, "chat")[1]["content"]
        assert "<answer>" not in official.prompt(example, "chat")[1]["content"]
        assert official.reward(official.solution(example, "chat"), example) >= official.pass_threshold


def test_trl_wrapper_takes_columns_and_both_completion_forms(all_tasks):
    for task in all_tasks:
        examples = task.examples("train", 3, seed=1)
        columns = {key: [e[key] for e in examples] for key in examples[0]}
        columns["prompts"] = [task.prompt(e, "chat") for e in examples]  # extra TRL columns are ignored
        good = [task.solution(e, "chat") for e in examples]
        expected = [task.reward(c, e) for c, e in zip(good, examples)]
        assert task.reward_fn(good, **columns) == expected
        conversational = [[{"role": "assistant", "content": c}] for c in good]
        assert task.reward_fn(completions=conversational, **columns) == expected
        parameters = inspect.signature(task.reward_fn).parameters
        assert "completions" in parameters and any(p.kind == p.VAR_KEYWORD for p in parameters.values())
        with pytest.raises(ValueError, match="column"):
            task.reward_fn(good)


HOSTILE = ["__import__('os').system('touch /tmp/pwned_by_tasks')", "9**9**9**9", "(" * 10_000 + "1" + ")" * 10_000,
           "7" * 100_000, "x" * 100_000, "١٢*٥-٣ ٤٢", "\\boxed{" * 5_000, "<answer>" * 20_000]


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_completions_never_pass(all_tasks, hostile):
    for task in all_tasks:
        example = task.examples("train", 1, seed=0)[0]
        for completion in (hostile, f"<think> x </think> <answer> {hostile} </answer>"):
            for style in ("chat", "compact"):
                assert task.reward(completion, example, style=style) < task.pass_threshold
    assert not pathlib.Path("/tmp/pwned_by_tasks").exists()


def test_no_eval_or_exec_in_tasks():
    for path in TASKS_DIR.glob("*.py"):
        source = path.read_text()
        assert not re.search(r"(?<![.\w])(eval|exec|compile|__import__)\s*\(", source), path.name  # re.compile is fine


@pytest.mark.parametrize("name, truth", [
    ("countdown", {"numbers": [3, 5, 7], "target": 22}),
    ("knights_knaves", {"solution_text_format": "(1) Zoey is a knight\n(2) Ethan is a knave"}),
    ("gsm8k", json.dumps({"task": "gsm8k", "reward": "exact", "answer": "22"})),
    ("deepmath", "22"),
])
def test_a_verl_file_prompt_is_the_task_prompt_verbatim(tmp_path, name, truth):
    if name in ("gsm8k", "deepmath"):
        pytest.importorskip("math_verify")
    messages = [{"role": "user", "content": "  Exactly this text, not ours.\n"}]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": messages, "reward_model": {"ground_truth": truth}}) + "\n")
    task = get_task(name, data=str(path))
    (example,) = task.splits["train"] + task.splits["test"]
    assert task.prompt(example, "chat") == messages
