"""integrations/trl_trainer.py: TRL's GRPOTrainer trains on our group advantages of the rewards it logged.

A few CPU steps of the real GRPOTrainer on the tiny Llama, with the Countdown task's reward_fn plugged in unchanged
(plus a second reward function so that rewards differ inside a group: the untrained model never solves Countdown).
Every micro-batch TRL hands to its loss is recorded and matched, completion by completion, to the rewards TRL logged
for that generation: its advantages must be group_advantages of those rewards (times AR's per-token factor).
"""
import importlib.util

import pytest
import torch

if importlib.util.find_spec("trl") is None:
    pytest.skip("TRL is not installed (pip install -r requirements-bench.txt)", allow_module_level=True)

from lopti import reweight_advantages  # noqa: E402
from harness.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402
from softmax_grpo import group_advantages  # noqa: E402
from tasks import COMPACT_ALPHABET, get_task  # noqa: E402

M = 4  # completions per prompt


def distinct_characters(completions, **_):
    """A reward that varies inside a group: distinct characters / 10."""
    return [len(set(c)) / 10 for c in completions]


def run_trl(tmp_path, advantage_method, tau, ar_alpha):
    """Two optimizer steps (2 prompts x M per generation, two micro-batches each); returns the recording trainer."""
    from datasets import Dataset
    from trl import GRPOConfig

    from integrations.trl_trainer import SoftmaxGRPOTrainer

    class RecordingTrainer(SoftmaxGRPOTrainer):
        """Records what TRL logs after each generation and every micro-batch its loss receives."""

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            n = len(output["prompt_ids"]) * self.accelerator.num_processes
            self.logged.append({"prompt": list(self._logs["prompt"])[-n:],
                                "completion": list(self._logs["completion"])[-n:],
                                "advantages": list(self._logs["advantages"])[-n:],
                                "rewards": {k: list(v)[-n:] for k, v in self._logs["rewards"].items()}})
            return output

        def _compute_loss(self, model, inputs):
            if not self.trained:  # before any update the policy is the sampling policy: p_old must match it
                input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
                mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
                with torch.no_grad():
                    self.first_logps = self._get_per_token_logps_and_entropies(
                        model, input_ids, mask, inputs["completion_ids"].size(1))[0]
            self.trained.append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})
            return super()._compute_loss(model, inputs)

    task = get_task("countdown", num_count=3)
    tokenizer = build_char_tokenizer(COMPACT_ALPHABET)
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=0)
    examples = task.examples("train", 8, seed=0)
    dataset = Dataset.from_list([{"prompt": task.prompt(ex, "compact"), "numbers": ex["numbers"],
                                  "target": ex["target"]} for ex in examples])  # plain-text prompts: no template
    config = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=M,
                        gradient_accumulation_steps=2, num_generations=M, max_completion_length=8,
                        learning_rate=1e-3, beta=0.0, use_cpu=True, report_to="none", logging_strategy="no",
                        save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = RecordingTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
                               reward_funcs=[task.reward_fn, distinct_characters],  # the task's reward_fn as is
                               advantage_method=advantage_method, tau=tau, ar_alpha=ar_alpha)
    trainer.logged, trainer.trained = [], []
    trainer.train()
    return trainer, tokenizer


@pytest.mark.parametrize("advantage_method, tau, ar_alpha", [("softmax", 0.3, 0.0), ("maxrl", 0.1, 0.3)])
def test_trl_trains_on_group_advantages_of_the_logged_rewards(tmp_path, advantage_method, tau, ar_alpha):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest and robust on a shared CPU
    try:
        trainer, tokenizer = run_trl(tmp_path, advantage_method, tau, ar_alpha)
    finally:
        torch.set_num_threads(threads)
    steps_per_generation = trainer.args.steps_per_generation
    assert len(trainer.logged) == 2 and len(trainer.trained) == 2 * steps_per_generation

    expected_by_generation = []
    for logged in trainer.logged:
        rewards = torch.tensor(logged["rewards"]["reward_fn"]) + torch.tensor(logged["rewards"]["distinct_characters"])
        advantages = group_advantages(rewards.view(-1, M), advantage_method, tau=tau).view(-1)
        assert advantages.abs().sum() > 0  # rewards differ inside the groups, so the check below has teeth
        assert logged["advantages"] == pytest.approx(advantages.tolist(), abs=1e-6)  # what TRL logs is ours
        # a completion repeated inside its group has the same reward, hence the same advantage: a dict is enough
        expected_by_generation.append({(p, c): a for p, c, a in zip(logged["prompt"], logged["completion"],
                                                                    advantages.tolist())})

    for step, inputs in enumerate(trainer.trained):
        expected = expected_by_generation[step // steps_per_generation]
        mask = inputs["completion_mask"]
        keys = [(tokenizer.decode(p, skip_special_tokens=True), tokenizer.decode(c[m.bool()], skip_special_tokens=True))
                for p, c, m in zip(inputs["prompt_ids"], inputs["completion_ids"], mask)]
        row_advantages = torch.tensor([expected[key] for key in keys])
        if ar_alpha == 0:
            torch.testing.assert_close(inputs["advantages"], row_advantages)
        else:
            p_old = inputs["old_per_token_logps"].exp()
            torch.testing.assert_close(inputs["advantages"], reweight_advantages(row_advantages, p_old, mask, ar_alpha))
    if ar_alpha > 0:
        first = trainer.trained[0]
        valid = first["completion_mask"].bool()
        torch.testing.assert_close(first["old_per_token_logps"][valid], trainer.first_logps[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("settings, message", [(dict(tau=0.0), "--tau must be > 0"),
                                               (dict(ar_alpha=True), "--alpha must be a number, got True"),
                                               (dict(ar_alpha=1.5), "--alpha must lie in [0, 1]")])
def test_bad_settings_fail_when_the_trainer_is_built(settings, message):
    # train.py's checks and messages, before TRL builds anything (tau <= 0 used to fail only once training started,
    # ar_alpha=True was taken as 1.0)
    from integrations.trl_trainer import SoftmaxGRPOTrainer
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SoftmaxGRPOTrainer(model=None, **settings)
