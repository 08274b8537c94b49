"""SoftmaxGRPO (or any of our group advantages) and Advantage Reweighting inside TRL's GRPOTrainer.

TRL's GRPOTrainer handles generation, multi-GPU, DeepSpeed/FSDP, PEFT and logging; this subclass
only replaces the advantages it trains on (usage: docs/scale-out.md, "TRL"):

    advantages = group_advantages(rewards.view(-1, M), method, tau=tau)     # softmax_grpo.py
    advantages = reweight_advantages(advantages, p_old, mask, alpha)        # lopti.py, ar_alpha > 0

`rewards` are what TRL logs (the reward functions' weighted sum, gathered over all processes, each
prompt's M completions adjacent), so every group is complete; TRL's scale_rewards is not used. Lopti
(two optimizer steps per batch) is not available here: train.py or integrations/verl_plugin.py.
"""
import os
import sys

import torch
from trl import GRPOTrainer

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root, from anywhere
from harness.config import Config  # noqa: E402
from lopti import reweight_advantages  # noqa: E402
from softmax_grpo import METHODS, group_advantages  # noqa: E402


class SoftmaxGRPOTrainer(GRPOTrainer):
    """GRPOTrainer training on group_advantages(rewards, advantage_method, tau=tau), optionally reweighted per token.

    advantage_method: one of softmax_grpo.METHODS ("softmax" is SoftmaxGRPO); tau: its temperature (paper: 0.1 on
    GSM8K and Countdown); ar_alpha: Advantage Reweighting's alpha (0 = off; paper: 0.2 alone, 0.3 with Lopti).
    With ar_alpha > 0 the trainer receives [B, T] advantages and p_old = exp(old per-token log-probs), which are
    computed after generation when TRL does not already compute them (text-only models).
    """

    def __init__(self, *args, advantage_method="softmax", tau=0.1, ar_alpha=0.0, **kwargs):
        if advantage_method not in METHODS:
            raise ValueError(f"unknown advantage_method {advantage_method!r}; choose from {', '.join(METHODS)}")
        try:  # train.py's checks and messages (harness/config.py), at construction, not once training starts
            Config(tau=tau, alpha=ar_alpha).validate()
        except ValueError as error:
            raise ValueError(f"SoftmaxGRPOTrainer(tau={tau!r}, ar_alpha={ar_alpha!r}): {error}") from None
        super().__init__(*args, **kwargs)
        self.advantage_method, self.tau, self.ar_alpha = advantage_method, tau, ar_alpha
        self._rewards_per_func = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's reward computation, unchanged; keeps its [N_all, n_funcs] result for the advantages below."""
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        M = self.num_generations if mode == "train" else self.num_generations_eval
        rewards_per_func = self._rewards_per_func
        if torch.isnan(rewards_per_func).all(dim=1).any():
            raise ValueError("a completion got None from every reward function; SoftmaxGRPOTrainer needs a reward "
                             "for every completion")
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # what TRL logs as "reward"
        if M < 2:  # evaluation with one completion per prompt: no group, no advantage
            advantages = torch.zeros_like(rewards)
        else:
            advantages = group_advantages(rewards.view(-1, M), self.advantage_method, tau=self.tau).view(-1)
        advantages = advantages.to(rewards.device)
        logged = self._logs["advantages"]  # TRL logged its own advantages for the whole batch: log ours instead
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())

        local = len(output["prompt_ids"])  # this process's rows of the gathered batch
        start = self.accelerator.process_index * local
        advantages = advantages[start:start + local]
        if self.ar_alpha > 0:
            old_logps = output.get("old_per_token_logps")
            if old_logps is None:  # TRL skips them when training is exactly on-policy; AR needs p_old
                old_logps = self._old_per_token_logps(output)
                output["old_per_token_logps"] = old_logps  # the loss then uses the same old log-probs
            advantages = reweight_advantages(advantages, old_logps.exp(), output["completion_mask"], self.ar_alpha)
        output["advantages"] = advantages
        return output

    @torch.no_grad()
    def _old_per_token_logps(self, output):
        """[B, T] log-probs of the completion tokens under the current (= sampling) policy, temperature-scaled."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.model, input_ids, attention_mask, output["completion_ids"].size(1),
            batch_size=self.args.per_device_train_batch_size)
        return logps
