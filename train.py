"""RL fine-tuning of a causal LM with SoftmaxGRPO advantages, Advantage Reweighting and Lopti.

    python train.py                       # offline: tiny Llama, warm start, SoftmaxGRPO, Countdown
    python train.py --help                # every setting (harness/config.py): default, paper value
    python train.py --resume runs/default # continue that run, with its saved settings

One RL step, the papers' Algorithm 1 (formulas: DESIGN.md):

    prompts    x_1 .. x_G                              task.examples
    rollouts   o_i1 .. o_iM ~ pi_theta(. | x_i)        collect_rollouts -> rollout.generate_rollouts
    rewards    R_ij                                    task.reward
    advantages A_ij = M softmax(R_i / tau)_j - 1       softmax_grpo.group_advantages (or GRPO's)
    fix pi_old and pi_ref of the sampled tokens        update_policy #1
    AR         A_ijt = (alpha p_old + 1 - alpha) A_ij  update_policy #2: lopti.reweight_advantages
    for each Lopti pass (p_old < eta first, then the rest; without Lopti one pass, all tokens):
        each epoch, each mini-batch: clipped surrogate + k3 KL (ppo.policy_loss), an optimizer step

The step (sections 1 and 2) uses only the lesson files beside this one (and fast/: the same numbers
sooner; --no-fast turns it off); the loop (section 3) runs on harness/. What a production trainer adds
(a serving engine, packing, several processes): docs/scale-out.md.
"""
import contextlib
import sys

from harness import config as settings

command_line = settings.load() if __name__ == "__main__" else None  # before torch: --help answers at once
import torch  # noqa: E402
from tqdm import tqdm

from harness import run
from harness.step_stats import StepStats
from lopti import lopti_passes, reweight_advantages
from ppo import forward_chunks, policy_loss, row_shares
from rollout import evaluate, generate_rollouts, precision, render_prompts, token_logprobs
from softmax_grpo import group_advantages


def no_clock(name):  # clock(name) -> a context timing one phase; benchmarks pass a real one
    return contextlib.nullcontext()


# --------------------------------------------------------------------------------------------------
# 1. Rollouts, rewards, group advantages
# --------------------------------------------------------------------------------------------------
def collect_rollouts(model, tokenizer, task, examples, config, *, clock=no_clock):
    """M sampled completions per example, their task rewards and group advantages (DESIGN.md
    sections 2, 5) -> (rollouts: rollout.Rollouts of B = len(examples) * M rows, rewards [B] float,
    advantages [B] float)."""
    device = next(model.parameters()).device
    with clock("rollout"), precision(device, config.dtype):
        rollouts = generate_rollouts(
            model, tokenizer, render_prompts(tokenizer, task, examples, config.style),
            config.num_generations, max_new_tokens=config.max_new_tokens,
            temperature=config.temperature, top_p=config.top_p,
            mask_truncated=config.mask_truncated, rollout_batch=config.rollout_batch,
            drop_finished_every=config.drop_finished_every, fast=config.fast,
            fast_generate=config.fast_generate)
    with clock("reward+advantage"):
        rewards = torch.tensor([float(task.reward(text, examples[i], style=config.style))
                                for text, i in zip(rollouts.completions,
                                                   rollouts.prompt_index.tolist())])
        if not torch.isfinite(rewards).all():
            raise ValueError(
                f"task {task.name!r} returned a non-finite reward for the completion "
                f"{rollouts.completions[int((~torch.isfinite(rewards)).nonzero()[0])]!r}")
        group_rewards = rewards.view(len(examples), config.num_generations)  # [G, M]
        lengths = rollouts.completion_mask.sum(1).view_as(group_rewards)  # reinforce_pp: tokens
        advantages = group_advantages(group_rewards, config.method, tau=config.tau,
                                      lengths=lengths).view(-1)  # [B]
    return rollouts, rewards, advantages


def rollout_stats(task, rollouts, rewards, advantages, num_generations):
    """The batch's metrics before the update: rewards, pass rate, zero-variance groups, lengths
    (python floats)."""
    group_rewards = rewards.view(-1, num_generations)  # [prompts, M]
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
def update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages,
                  config, *, ref_model=None, old_logprobs=None, clock=no_clock):
    """Train on one batch (Algorithm 1 after the advantages) -> stats (python floats). input_ids,
    attention_mask [B, P+T]; completion_mask [B, T]; advantages [B]; old_logprobs [B, T] or None."""
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    mask, advantages = completion_mask.to(device).float(), advantages.to(device)

    def logprobs_of(policy, rows, **kwargs):  # [rows, T] log-probs of the sampled tokens
        with clock("log-prob forward"), precision(device, config.dtype):
            return token_logprobs(policy, input_ids[rows], attention_mask[rows], mask[rows],
                                  temperature=config.temperature, micro_batch=config.micro_batch,
                                  logit_chunk=config.logit_chunk, fast=config.fast,
                                  body_autocast=not config.logprob_fp32, **kwargs)

    # 1. pi_ref and pi_old of the sampled tokens, fixed before any update (rows with a gradient)
    active = (mask.any(1) & ((advantages != 0) | (ref_model is not None))).nonzero().squeeze(1)
    with torch.no_grad():
        ref_logprobs = None if ref_model is None else logprobs_of(ref_model, slice(None))
    old_logprobs, old_probs = fixed_pi_old(model, logprobs_of, active, mask, old_logprobs, config)

    # 2. AR, once per batch: token advantages A_t = (alpha p_old + 1 - alpha) A
    token_adv = reweight_advantages(advantages, old_probs, mask, config.alpha)  # [B, T]

    # 3. Lopti's passes (low-probability tokens first), each ppo_epochs x mini_batches steps
    stats = StepStats()  # the loss's stats, summed on the device (harness/step_stats.py)
    passes = lopti_passes(token_adv, old_probs, mask, config.lopti_eta, config.lopti_order)
    for name, pass_adv, pass_mask in passes:
        trained = rows_with_gradient(pass_adv, pass_mask, kl=ref_model is not None)  # [B] bool
        for epoch in range(config.ppo_epochs):
            for mini_batch, rows in mini_batches_with_gradient(trained, config.mini_batches):
                share = row_shares(mask, mini_batch, config.loss_agg, config.micro_batch)
                optimizer.zero_grad(set_to_none=True)
                for micro in forward_chunks(rows, mini_batch, config.loss_agg, config.micro_batch):
                    logprobs, entropy = logprobs_of(model, micro, with_entropy=True)
                    old = logprobs.detach() if old_logprobs is None else old_logprobs[micro]
                    loss, loss_stats = policy_loss(
                        logprobs, old, pass_adv[micro], mask[micro], clip_low=config.clip_low,
                        clip_high=config.clip_high, dual_clip=config.dual_clip,
                        kl_coef=config.kl_coef, kl_clamp=config.kl_clamp, kl_mask=pass_mask[micro],
                        ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro],
                        loss_agg=config.loss_agg, norm_constant=config.max_new_tokens)
                    (loss * share[micro].sum()).backward()  # summed: the mini-batch's loss
                    stats.add(loss_stats, loss, entropy, mask[micro], weight=share[micro].sum())
                stats.grad_norms.append(optimizer.grad_norm() if config.step_in_backward else  # no clip
                                        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
                optimizer.step()
    low = {name: pass_mask for name, _, pass_mask in passes}.get("low")  # Lopti's split, as trained
    return {**stats.result(), **({} if low is None else  # its share of the tokens that can learn
                                 {"lopti_low_share": (low[active].sum() / mask[active].sum().clamp_min(1)).item()})}


def fixed_pi_old(model, logprobs_of, rows, mask, old_logprobs, config):
    """(log pi_old, p_old) [B, T] of the sampled tokens, fixed before the batch's first update, or
    (None, None): the speed rule. When nothing reads p_old before the loss (no AR, no Lopti, one
    optimizer step), each training forward's detached log-probs are pi_old, so no pi_old forward
    runs (docs/performance.md). Otherwise one no-grad forward of `rows` (those that can get a
    gradient) fixes it; the other rows keep p_old 1. --no-fast always runs that forward.
    old_logprobs: the caller's pi_old, taken as it is."""
    reads_p_old = config.alpha + config.lopti_eta > 0 or config.ppo_epochs * config.mini_batches > 1
    if old_logprobs is None and (reads_p_old or not config.fast):
        with torch.no_grad():
            old_logprobs = torch.zeros_like(mask).index_put((rows,), logprobs_of(model, rows))
    if old_logprobs is None:
        return None, None
    old_logprobs = old_logprobs.to(mask.device)
    return old_logprobs, old_logprobs.exp()


def rows_with_gradient(pass_adv, pass_mask, *, kl):
    """[B] bool: rows whose loss has a gradient in this pass (a non-zero advantage, or KL on any of
    its tokens). The others are skipped: their loss is 0 and constant, though they still count in
    the mini-batch's mean."""
    return (pass_adv != 0).any(1) | (kl & pass_mask.any(1))


def mini_batches_with_gradient(trained, count):
    """The batch's rows in `count` contiguous mini-batches -> [(mini_batch, its rows with a
    gradient)], leaving out a mini-batch with none: nothing to learn, so no optimizer step (AdamW
    would still move the weights)."""
    splits = torch.arange(len(trained), device=trained.device).tensor_split(count)
    return [(mini_batch, mini_batch[trained[mini_batch]])
            for mini_batch in splits if trained[mini_batch].any()]


# --------------------------------------------------------------------------------------------------
# 3. The loop
# --------------------------------------------------------------------------------------------------
def train(config):
    """Run config.steps RL steps (fresh, or continuing a run config.load resumed) -> {"before",
    "after", "metrics_path"}."""
    config, tokenizer, task, prompts = run.settle(config)  # every setting decided here, then frozen
    if config.dry_run:
        return run.print_settings(config)
    with run.start(config) as state:  # the folder locked, never over a run; Ctrl-C saves
        model, ref_model = run.build_policy(config, tokenizer, task, log=tqdm.write)  # + warm start
        trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
        AdamW = run.adamw_class(config)  # torch's (--optimizer adamw8bit: torchao's, 8-bit moments)
        optimizer = AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
        with run.input_errors():  # too few test rows, a prompt longer than the context: one line
            eval_examples = task.examples("test", config.eval_size, seed=config.seed)
            prompts = run.within_context(prompts, eval_examples, model, tokenizer, task, config)

        def evaluate_now(samples):  # greedy pass@1 and mean reward on the held-out prompts
            with precision(model.device, config.dtype):
                return evaluate(model, tokenizer, task, eval_examples, style=config.style,
                                max_new_tokens=config.max_new_tokens, samples=samples,
                                fast=config.fast, batch_size=config.rollout_batch or 256)

        state.begin(model, tokenizer, optimizer, evaluate_now, task, eval_examples)  # fresh: eval at 0
        progress = tqdm(range(state.step + 1, config.steps + 1), initial=state.step,
                        total=config.steps, desc="RL", bar_format=run.BAR_FORMAT)
        for step in progress:
            # --- 1. rollouts, rewards, group advantages -------------------------------------------
            run.set_learning_rate(optimizer, config, step)  # linear warm-up, then constant
            examples = prompts(step)  # the step's prompts_per_step training examples
            rollouts, rewards, advantages = collect_rollouts(model, tokenizer, task, examples,
                                                             config, clock=state.clock)
            # --- 2. the update --------------------------------------------------------------------
            page = state.page_before_update(step, rollouts, rewards)  # --inspect-every, else None
            stats = update_policy(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                                  rollouts.completion_mask, advantages, config, ref_model=ref_model,
                                  clock=state.clock)
            state.page_after_update(page, stats)  # the step's HTML page (docs/runs.md, "See one step")
            # --- 3. metrics, held-out eval, checkpoint (harness/run.py) ---------------------------
            batch = rollout_stats(task, rollouts, rewards, advantages, config.num_generations)
            row = state.log({"step": step, **batch, **stats, "lr": optimizer.param_groups[0]["lr"]},
                            tokens=rollouts.completion_mask.sum().item())
            progress.set_postfix_str(run.progress_line(row))  # reward, pass rate, length, s/step
            if state.end_of_step(step):  # evals, saves when due; True after Ctrl-C or --idle-stop
                break
        before, after = state.initial_eval, state.final_eval()

    # --- before / after: held-out greedy eval of the initial and the final weights ----------------
    print(f"\n{f'held-out, greedy, {len(eval_examples)} prompts':<32}{'pass@1':>8}{'reward':>8}")
    before_label = "before RL" + (" (after warm start)" if config.model == "tiny" else "")
    for label, result in [(before_label, before), (f"after RL (step {state.step})", after)]:
        print(f"{label:<32}{result['pass@1']:>8.3f}{result['reward']:>8.3f}")
    print(f"{state.trained_line()}\nmetrics: {state.metrics_path}")
    if state.exit_code:  # a signal (once the checkpoint is safe: 130, 143, 129) or --idle-stop (3)
        sys.exit(state.exit_code)
    return {"before": before, "after": after, "metrics_path": state.metrics_path}


def main(argv=None):
    """`python train.py [flags]`. argv: the flags (default: sys.argv), or a Config already loaded
    from them. Errors a user can act on are one line (bad input: exit 2; the run's files: 1); any
    other is a bug: its traceback."""
    config = argv if isinstance(argv, settings.Config) else settings.load(argv)  # + a resumed run's
    try:
        return train(config)
    except (settings.InputError, run.RunError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, settings.InputError) else 1)
    except run.Stopped as stop:  # a signal before the first step: nothing to save
        sys.exit(128 + stop.signum)


if __name__ == "__main__":
    main(command_line)
