"""RL fine-tuning of a causal LM with SoftmaxGRPO advantages, Advantage Reweighting and Lopti.

    python train.py                       # offline: tiny Llama, warm start, SoftmaxGRPO, Countdown
    python train.py --help                # every setting (harness/config.py): default, paper value
    python train.py --resume runs/default # continue that run, with its saved settings

One RL step, the papers' Algorithm 1 (formulas: DESIGN.md):

    prompts    x_1 .. x_G                              task.examples
    rollouts   o_i1 .. o_iM ~ pi_theta(. | x_i)        collect_rollouts -> rollout.generate_rollouts
    rewards    R_ij                                    task.reward
    advantages A_ij = M softmax(R_i / tau)_j - 1       softmax_grpo.group_advantages (or GRPO's)
    fix pi_old and pi_ref of the sampled tokens        update_policy: a no-grad token_logprobs
    AR         A_ijt = (alpha p_old + 1 - alpha) A_ij  lopti.reweight_advantages
    for each Lopti pass (p_old < eta first, then the rest; without Lopti one pass, all tokens):
        each epoch, each mini-batch: clipped surrogate + k3 KL (ppo.policy_loss), an optimizer step

The step, collect_rollouts and update_policy, uses only the lesson files beside this one. The
update's speed and memory rules (micro-batches, rows without a gradient skipped, no pi_old forward
when nothing reads it) are fast/update.py, which the loop's update_batch takes behind one
`if config.fast:` (--no-fast: update_policy as written here; tests/test_update.py holds them equal).
The loop (section 3) runs on harness/. What a production trainer adds (a serving engine, packing,
several processes): docs/scale-out.md.
"""
from harness.before_torch import command_line  # python train.py: --help answers before torch loads
import contextlib
import sys

import torch
from tqdm import tqdm

from fast.precision import precision
from fast.update import update_policy as fast_update_policy
from harness.config import Config, InputError
from harness.console import BAR_FORMAT, progress_line
from harness.files import RunError
from harness.flags import load
from harness.policy import adamw_class, build_policy, set_learning_rate
from harness.prompts import within_context
from harness.run import start
from harness.settle import input_errors, print_settings, settle
from harness.stops import Stopped
from lopti import lopti_passes, reweight_advantages
from ppo import UpdateStats, policy_loss, rows_with_gradient, token_weights
from rollout import evaluate, generate_rollouts, render_prompts, token_logprobs
from softmax_grpo import group_advantages


def no_clock(name):  # clock(name) -> a context timing one phase; benchmarks pass a real one
    return contextlib.nullcontext()


# --------------------------------------------------------------------------------------------------
# 1. Rollouts, rewards, group advantages
# --------------------------------------------------------------------------------------------------
def collect_rollouts(model, tokenizer, task, examples, config, *, clock=no_clock):
    """M sampled completions per example, their task rewards and group advantages (DESIGN.md
    sections 2, 5) -> (rollouts: rollout.Rollouts of B = len(examples) * M rows, rewards [B] float,
    advantages [B] float). Reads the settings ROLLOUT_SETTINGS names. Generates under --dtype's
    precision (bf16: autocast), whoever calls it."""
    with clock("rollout"), precision(next(model.parameters()).device, config.dtype):
        rollouts = generate_rollouts(
            model, tokenizer, render_prompts(tokenizer, task, examples, config.style),
            config.num_generations, max_new_tokens=config.max_new_tokens,
            temperature=config.temperature, top_p=config.top_p,
            mask_truncated=config.mask_truncated, rollout_batch=config.rollout_batch,
            fast=config.fast and dict(share_prefill=True, compiled=config.fast_generate,
                                      drop_finished_every=config.drop_finished_every))
    with clock("reward+advantage"):
        scored = [examples[i] for i in rollouts.prompt_index.tolist()]  # x_i of each o_ij
        if hasattr(task, "rewards"):  # the run's task: all in one call (harness/reward_worker.py)
            rewards = task.rewards(rollouts.completions, scored, style=config.style)
        else:
            rewards = [float(task.reward(text, example, style=config.style))
                       for text, example in zip(rollouts.completions, scored)]
        rewards = torch.tensor(rewards)
        if not torch.isfinite(rewards).all():
            raise ValueError(
                f"task {task.name!r} returned a non-finite reward for the completion "
                f"{rollouts.completions[int((~torch.isfinite(rewards)).nonzero()[0])]!r}")
        group_rewards = rewards.view(-1, rollouts.num_generations)  # [G, M]
        lengths = rollouts.completion_mask.sum(1).view_as(group_rewards)  # reinforce_pp: tokens
        advantages = group_advantages(group_rewards, config.method, tau=config.tau,
                                      lengths=lengths).view(-1)  # [B]
    return rollouts, rewards, advantages


ROLLOUT_SETTINGS = ("style", "num_generations", "max_new_tokens", "temperature", "top_p",
                    "mask_truncated", "rollout_batch", "fast", "drop_finished_every",
                    "fast_generate", "method", "tau", "dtype")


def rollout_stats(task, rollouts, rewards, advantages):
    """The batch's metrics before the update: rewards, pass rate, zero-variance groups, lengths
    (python floats)."""
    group_rewards = rewards.view(-1, rollouts.num_generations)  # [G, M]
    return {"reward_mean": rewards.mean().item(),
            "pass_rate": (rewards >= task.pass_threshold).float().mean().item(),
            "zero_var_share": (group_rewards.max(1).values
                               == group_rewards.min(1).values).float().mean().item(),
            "adv_abs_mean": advantages.abs().mean().item(),
            "response_length": rollouts.completion_mask.sum().item() / len(rewards),
            "truncated_share": rollouts.truncated.float().mean().item()}


# --------------------------------------------------------------------------------------------------
# 2. The update: pi_old, AR, Lopti's passes, clipped-surrogate optimizer steps
# --------------------------------------------------------------------------------------------------
def update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages, *,
                  ref_model=None, alpha=0.0, lopti_eta=0.0, lopti_order="low-first", ppo_epochs=1,
                  mini_batches=1, clip_low=0.2, clip_high=0.28, dual_clip=None, kl_coef=0.0,
                  kl_clamp=20.0, loss_agg="token-mean", norm_constant=None, grad_clip=1.0,
                  temperature=1.0, micro_batch=None):
    """Algorithm 1's update on one batch -> stats (python floats, ppo.UpdateStats). input_ids,
    attention_mask [B, P+T]; completion_mask [B, T]; advantages [B]; all on the model's device.
    micro_batch: rows per forward and backward (None: a mini-batch at once); the gradients add up
    to the mini-batch's, exactly, for every loss_agg (ppo.token_weights)."""
    mask, kl = completion_mask.float(), ref_model is not None
    batch_rows = torch.arange(len(advantages), device=advantages.device)
    learns = mask.any(1) & ((advantages != 0) | kl)  # [B]: the rows that can learn

    def logprobs_of(policy, rows, with_entropy=False):  # [rows, T] log pi of the sampled tokens
        return token_logprobs(policy, input_ids[rows], attention_mask[rows], mask[rows],
                              temperature=temperature, micro_batch=micro_batch,
                              with_entropy=with_entropy)

    with torch.no_grad():  # 1. pi_old (its entropy: a metric) and pi_ref, fixed before any update
        old_logprobs, entropy = logprobs_of(model, batch_rows, with_entropy=True)
        ref_logprobs = logprobs_of(ref_model, batch_rows) if kl else None
    old_probs = old_logprobs.exp()
    token_adv = reweight_advantages(advantages, old_probs, mask, alpha)  # 2. AR, once per batch
    stats = UpdateStats()
    passes = lopti_passes(token_adv, old_probs, mask, lopti_eta, lopti_order)  # 3. Lopti's passes
    for name, pass_adv, pass_mask in passes:
        for epoch in range(ppo_epochs):  # each pass, epoch and mini-batch: one optimizer step
            for mini_batch in batch_rows.tensor_split(mini_batches):
                weights = token_weights(mask[mini_batch], loss_agg, norm_constant)  # [rows, T]
                trained = mini_batch[rows_with_gradient(pass_adv[mini_batch],
                                                        pass_mask[mini_batch], kl=kl)]
                if len(trained) == 0:  # nothing to learn: no step (AdamW would still move)
                    continue
                optimizer.zero_grad()
                for rows in trained.split(micro_batch or len(mini_batch)):
                    loss, loss_stats = policy_loss(
                        logprobs_of(model, rows), old_logprobs[rows], pass_adv[rows], mask[rows],
                        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                        kl_coef=kl_coef, kl_clamp=kl_clamp, kl_mask=pass_mask[rows],
                        ref_logprobs=ref_logprobs[rows] if kl else None,
                        weights=weights[rows - mini_batch[0]])
                    loss.backward()  # gradients add up: the chunks' losses sum to the mini-batch's
                    stats.add(loss_stats, loss, mask[rows], pass_mask[rows])
                stats.step(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
                optimizer.step()
    return stats.result(entropy[learns], mask[learns], passes, learns, mask)


UPDATE_SETTINGS = ("alpha", "lopti_eta", "lopti_order", "ppo_epochs", "mini_batches", "clip_low",
                   "clip_high", "dual_clip", "kl_coef", "kl_clamp", "loss_agg", "grad_clip",
                   "temperature", "micro_batch")


def update_batch(model, optimizer, input_ids, attention_mask, completion_mask, advantages, config,
                 *, ref_model=None, old_logprobs=None, clock=no_clock):
    """The loop's update: update_policy with the run's UPDATE_SETTINGS, or its fast path (the same
    update sooner, in less memory: fast/update.py; old_logprobs, a given pi_old, only there)."""
    if config.fast:
        return fast_update_policy(model, optimizer, input_ids, attention_mask, completion_mask,
                                  advantages, config, ref_model=ref_model,
                                  old_logprobs=old_logprobs, clock=clock)
    if old_logprobs is not None:
        raise ValueError("update_policy fixes pi_old itself: old_logprobs needs config.fast")
    device = next(model.parameters()).device
    with precision(device, config.dtype):
        return update_policy(model, optimizer, input_ids.to(device), attention_mask.to(device),
                             completion_mask.to(device), advantages.to(device), ref_model=ref_model,
                             norm_constant=config.max_new_tokens,
                             **{name: getattr(config, name) for name in UPDATE_SETTINGS})


# --------------------------------------------------------------------------------------------------
# 3. The loop
# --------------------------------------------------------------------------------------------------
def train(config):
    """Run config.steps RL steps (fresh, or continuing a run flags.load resumed) -> {"before",
    "after", "metrics_path"}."""
    config, tokenizer, task, prompts = settle(config)  # every setting decided here, then frozen
    if config.dry_run:
        return print_settings(config)
    with start(config) as state:  # the folder locked, never over a run; Ctrl-C saves
        model, ref_model = build_policy(config, tokenizer, task, log=tqdm.write)  # + warm start
        trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
        AdamW = adamw_class(config)  # torch's (--optimizer adamw8bit: torchao's, 8-bit moments)
        optimizer = AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
        with input_errors():  # too few test rows, a prompt longer than the context: one line
            eval_examples = task.examples("test", config.eval_size, seed=config.seed)
            prompts = within_context(prompts, eval_examples, model, tokenizer, task, config)

        def evaluate_now(samples):  # greedy pass@1 and mean reward on the held-out prompts
            with precision(model.device, config.dtype):
                return evaluate(model, tokenizer, task, eval_examples, style=config.style,
                                max_new_tokens=config.max_new_tokens, samples=samples,
                                fast=config.fast, batch_size=config.rollout_batch or 256)

        # a fresh run: the eval at step 0
        state.begin(model, tokenizer, optimizer, evaluate_now, task, eval_examples)
        progress = tqdm(range(state.step + 1, config.steps + 1), initial=state.step,
                        total=config.steps, desc="RL", bar_format=BAR_FORMAT)
        for step in progress:
            # --- 1. rollouts, rewards, group advantages -------------------------------------------
            set_learning_rate(optimizer, config, step)  # linear warm-up, then constant
            examples = prompts(step)  # the step's prompts_per_step training examples
            rollouts, rewards, advantages = collect_rollouts(model, tokenizer, task, examples,
                                                             config, clock=state.clock)
            # --- 2. the update --------------------------------------------------------------------
            page = state.page_before_update(step, rollouts, rewards)  # --inspect-every, else None
            stats = update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                                 rollouts.completion_mask, advantages, config, ref_model=ref_model,
                                 clock=state.clock)
            state.page_after_update(page, stats)  # the HTML page (docs/runs.md, "See one step")
            # --- 3. metrics, held-out eval, checkpoint (harness/run.py) ---------------------------
            batch = rollout_stats(task, rollouts, rewards, advantages)
            row = state.log({"step": step, **batch, **stats, "lr": optimizer.param_groups[0]["lr"]},
                            tokens=rollouts.completion_mask.sum().item())
            progress.set_postfix_str(progress_line(row))  # reward, pass rate, length, s/step
            if state.end_of_step(step):  # evals, saves when due; True after Ctrl-C or --idle-stop
                break
        before, after = state.initial_eval, state.final_eval()

    # --- before / after: held-out greedy eval of the initial and the final weights ----------------
    print(f"\n{f'held-out, greedy, {len(eval_examples)} prompts':<32}{'pass@1':>8}{'+/- se':>8}"
          f"{'reward':>8}")  # se: the standard error over the held-out prompts
    before_label = "before RL" + (" (after warm start)" if config.model == "tiny" else "")
    for label, result in [(before_label, before), (f"after RL (step {state.step})", after)]:
        print(f"{label:<32}{result['pass@1']:>8.3f}{result.get('pass@1_se', 0.0):>8.3f}"
              f"{result['reward']:>8.3f}")
    print(f"{state.trained_line()}\nmetrics: {state.metrics_path}")
    if state.exit_code:  # a signal (once the checkpoint is safe: 130, 143, 129) or --idle-stop (3)
        sys.exit(state.exit_code)
    return {"before": before, "after": after, "metrics_path": state.metrics_path}


def main(argv=None):
    """`python train.py [flags]`. argv: the flags (default: sys.argv), or a Config already loaded
    from them. Errors a user can act on are one line (bad input: exit 2; the run's files: 1); any
    other is a bug: its traceback."""
    config = argv if isinstance(argv, Config) else load(argv)  # + a resumed run's
    try:
        return train(config)
    except (InputError, RunError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, InputError) else 1)
    except Stopped as stop:  # a signal before the first step: nothing to save
        sys.exit(128 + stop.signum)


if __name__ == "__main__":
    main(command_line)
