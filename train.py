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

The step, collect_rollouts and update_policy, uses the lesson files alone, and is what
`python train.py` runs (--fast-generate: rollout.py's one opt-in, fast/'s decode loop). The loop
runs on harness/. A production trainer's extras: docs/scale-out.md.
"""
import contextlib
import sys

from harness import flags  # the command line first: --help and a bad flag answer before torch loads
if __name__ == "__main__":
    command_line = flags.load(sys.argv[1:])  # a Config (+ a resumed run's saved settings)

import torch
from tqdm import tqdm

from harness import console, files, metrics, policy, prompts, run, settle, stops
from harness.config import Config, InputError
from lopti import lopti_passes, reweight_advantages
from ppo import merge_stats, policy_loss, rows_with_gradient, token_weights
from rollout import evaluate, generate_rollouts, precision, render_prompts, token_logprobs
from softmax_grpo import group_advantages


def no_clock(name):  # clock(name) -> a context timing one phase; benchmarks pass a real one
    return contextlib.nullcontext()


# === 1. Rollouts, rewards, group advantages =======================================================
def collect_rollouts(model, tokenizer, task, examples, config, *, clock=no_clock):
    """M sampled completions per example, their rewards and group advantages (DESIGN.md 2, 5) ->
    (rollout.Rollouts of B = len(examples) * M rows, rewards [B], advantages [B]). Reads the
    ROLLOUT_SETTINGS; generates under --dtype's precision (bf16: autocast), whoever calls it."""
    with clock("rollout"), precision(next(model.parameters()).device, config.dtype):
        rollouts = generate_rollouts(
            model, tokenizer, render_prompts(tokenizer, task, examples, config.style),
            config.num_generations, max_new_tokens=config.max_new_tokens,
            temperature=config.temperature, top_p=config.top_p,
            mask_truncated=config.mask_truncated, rollout_batch=config.rollout_batch,
            fast_generate=config.fast_generate)
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
                    "mask_truncated", "rollout_batch", "fast_generate", "method", "tau", "dtype")


# === 2. The update: pi_old, AR, Lopti's passes, clipped-surrogate optimizer steps =================
def update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages, *,
                  ref_model=None, alpha=0.0, lopti_eta=0.0, lopti_order="low-first", ppo_epochs=1,
                  mini_batches=1, clip_low=0.2, clip_high=0.28, dual_clip=None, kl_coef=0.0,
                  kl_clamp=20.0, loss_agg="token-mean", norm_constant=None, grad_clip=1.0,
                  temperature=1.0, micro_batch=64, logit_chunk=1024, autocast_dtype=None,
                  old_logprobs=None, clock=no_clock):
    """Algorithm 1's update on one batch -> stats (floats). input_ids, attention_mask [B, P+T];
    completion_mask [B, T]; advantages [B]; old_logprobs [B, T] or None (measured). micro_batch:
    rows per forward (exact: ppo.token_weights); autocast_dtype: the forwards' (None: the weights').
    The defaults are harness/config.py's, which `python train.py` passes (tests/test_update.py).
    On-policy by default: the one step runs at pi_old's weights, so the ratio is 1 and the clip
    cannot act; --ppo-epochs 2 or --mini-batches 2 take later steps, where it does."""
    mask, kl = completion_mask.float(), ref_model is not None
    learns = mask.any(1) & ((advantages != 0) | kl)  # [B]: the rows that can learn
    batch_rows = torch.arange(len(mask), device=mask.device)
    steps, entropy = [], []  # each optimizer step's stats; each forward's (entropy, mask)

    def logprobs_of(net, rows):  # [rows, T] log pi of net (the policy's entropy a metric)
        with clock("log-prob forward"), torch.autocast(mask.device.type, dtype=autocast_dtype,
                                                       enabled=autocast_dtype is not None):
            logprobs, token_entropy = token_logprobs(
                net, input_ids[rows], attention_mask[rows], mask[rows], temperature=temperature,
                micro_batch=micro_batch, with_entropy=True, logit_chunk=logit_chunk)
        if net is model:
            entropy.append((token_entropy, mask[rows]))
        return logprobs

    # 1. pi_old and pi_ref of the sampled tokens, fixed before any update. The on-policy rule: a
    # first step runs at pi_old's weights, so its forwards' log-probs, detached, ARE pi_old; no
    # pi_old forward runs unless AR, Lopti or a later step (at new weights) reads it.
    with torch.no_grad():
        ref_logprobs = logprobs_of(ref_model, batch_rows) if kl else None
        if old_logprobs is None and (alpha > 0 or lopti_eta > 0 or ppo_epochs * mini_batches > 1):
            old_logprobs = torch.zeros_like(mask)  # rows that cannot learn: 0, nothing reads them
            old_logprobs[learns] = logprobs_of(model, learns.nonzero().squeeze(1))
    old_probs = None if old_logprobs is None else old_logprobs.exp()
    token_adv = reweight_advantages(advantages, old_probs, mask, alpha)  # 2. AR, once per batch
    passes = lopti_passes(token_adv, old_probs, mask, lopti_eta, lopti_order)  # 3. Lopti's passes
    for name, pass_adv, pass_mask in passes:
        trained = rows_with_gradient(pass_adv, pass_mask, kl=kl)  # [B] bool
        for epoch in range(ppo_epochs):  # each pass, epoch and mini-batch: one optimizer step
            for mini_batch in batch_rows.tensor_split(mini_batches):
                if not trained[mini_batch].any():  # nothing to learn: no step (AdamW would move)
                    continue
                weights = token_weights(mask[mini_batch], loss_agg, norm_constant, micro_batch)
                optimizer.zero_grad()
                chunks = []  # (policy_loss's stats, the rows' mask, their KL mask) of each forward
                for rows in forward_chunks(mini_batch, trained, loss_agg, micro_batch):
                    logprobs = logprobs_of(model, rows)
                    old = logprobs.detach() if old_logprobs is None else old_logprobs[rows]
                    loss, loss_stats = policy_loss(
                        logprobs, old, pass_adv[rows], mask[rows], clip_low=clip_low,
                        clip_high=clip_high, dual_clip=dual_clip, kl_coef=kl_coef,
                        kl_clamp=kl_clamp, kl_mask=pass_mask[rows],
                        ref_logprobs=ref_logprobs[rows] if kl else None,
                        weights=weights[rows - mini_batch[0]])
                    loss.backward()  # gradients add up: the chunks' losses sum to the mini-batch's
                    chunks.append(({**loss_stats, "loss": loss.detach()}, mask[rows],
                                   pass_mask[rows]))
                grad_norm = clipped_grad_norm(model, optimizer, grad_clip)
                steps.append({**merge_stats(chunks), "grad_norm": grad_norm})
                optimizer.step()
    return update_stats(steps, entropy, passes, learns, mask)


def forward_chunks(mini_batch, trained, loss_agg, micro_batch):
    """The mini-batch's rows with a gradient (`trained` [B] bool), micro_batch at a time (token-
    mean-per-micro-batch: inside the mini-batch's micro-batches, whose token means it takes)."""
    if loss_agg != "token-mean-per-micro-batch":
        return mini_batch[trained[mini_batch]].split(micro_batch or len(mini_batch))
    micros = mini_batch.split(micro_batch or len(mini_batch))
    return [micro[trained[micro]] for micro in micros if trained[micro].any()]


def clipped_grad_norm(model, optimizer, grad_clip):
    """The gradient's global norm, clipped to grad_clip (--step-in-backward: the norm the optimizer
    measured as it stepped each weight in backward, with nothing left to clip)."""
    if getattr(optimizer, "step_in_backward", False):
        return optimizer.grad_norm()
    return torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)


def update_stats(steps, entropy, passes, learns, mask):
    """-> python floats (the one read from the device): each step stat's mean over the optimizer
    steps (ratio_max: the max), optimizer_steps; entropy: the token mean over the update's forwards
    (the first at pi_old's weights); with Lopti, lopti_low_share: the share of the tokens that can
    learn (rows `learns` [B] bool) in its low pass."""
    stats = {"optimizer_steps": len(steps)}
    for key in (steps[0] if steps else {}):
        values = torch.stack([step[key] for step in steps])
        stats[key] = (values.max() if key == "ratio_max" else values.mean()).item()
    token_entropy, token_mask = [torch.cat(parts) for parts in zip(*entropy)] or (mask[:0],) * 2
    stats["entropy"] = ((token_entropy * token_mask).sum() / token_mask.sum().clamp_min(1)).item()
    for name, _, pass_mask in passes:
        if name == "low":
            low = pass_mask[learns].sum() / mask[learns].sum().clamp_min(1)
            stats["lopti_low_share"] = low.item()
    return stats


UPDATE_SETTINGS = ("alpha", "lopti_eta", "lopti_order", "ppo_epochs", "mini_batches", "clip_low",
                   "clip_high", "dual_clip", "kl_coef", "kl_clamp", "loss_agg", "grad_clip",
                   "temperature", "micro_batch", "logit_chunk")


def update_batch(model, optimizer, input_ids, attention_mask, completion_mask, advantages, config,
                 *, ref_model=None, old_logprobs=None, clock=no_clock):
    """The loop's update: update_policy with the run's UPDATE_SETTINGS, its forwards under --dtype
    (bf16: autocast; --logprob-fp32: none), timed by clock."""
    device = next(model.parameters()).device
    bf16 = config.dtype == "bf16" and not config.logprob_fp32
    return update_policy(model, optimizer, input_ids.to(device), attention_mask.to(device),
                         completion_mask.to(device), advantages.to(device), ref_model=ref_model,
                         norm_constant=config.max_new_tokens, clock=clock,
                         autocast_dtype=torch.bfloat16 if bf16 else None,
                         old_logprobs=None if old_logprobs is None else old_logprobs.to(device),
                         **{name: getattr(config, name) for name in UPDATE_SETTINGS})


# === 3. The loop ==================================================================================
def train(config):
    """Run config.steps RL steps, fresh or resumed -> {"before", "after", "metrics_path"}."""
    config, tokenizer, task, draw_prompts = settle.settle(config)  # every setting decided, frozen
    if config.dry_run:
        return settle.print_settings(config)
    with run.start(config) as state:  # the folder locked, never over a run; Ctrl-C saves
        model, ref_model = policy.build_policy(config, tokenizer, task, log=tqdm.write)
        trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
        AdamW = policy.adamw_class(config)  # torch's; --optimizer adamw8bit: torchao's
        optimizer = AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
        with settle.input_errors():  # too few test rows, a prompt longer than the context: one line
            eval_examples = task.examples("test", config.eval_size, seed=config.seed)
            draw_prompts = prompts.within_context(draw_prompts, eval_examples, model, tokenizer,
                                                  task, config)

        def evaluate_now(samples):  # greedy pass@1 and mean reward on the held-out prompts
            with precision(model.device, config.dtype):
                return evaluate(model, tokenizer, task, eval_examples, style=config.style,
                                max_new_tokens=config.max_new_tokens, samples=samples,
                                batch_size=config.rollout_batch or 256)

        state.begin(model, tokenizer, optimizer, evaluate_now, task, eval_examples)  # step 0's eval
        progress = tqdm(range(state.step + 1, config.steps + 1), initial=state.step,
                        total=config.steps, desc="RL", bar_format=console.BAR_FORMAT)
        for step in progress:
            # --- 1. rollouts, rewards, group advantages -------------------------------------------
            policy.set_learning_rate(optimizer, config, step)  # linear warm-up, then constant
            examples = draw_prompts(step)  # the step's prompts_per_step training examples
            rollouts, rewards, advantages = collect_rollouts(model, tokenizer, task, examples,
                                                             config, clock=state.clock)
            # --- 2. the update --------------------------------------------------------------------
            page = state.page_before_update(step, rollouts, rewards)  # --inspect-every, else None
            stats = update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                                 rollouts.completion_mask, advantages, config, ref_model=ref_model,
                                 clock=state.clock)
            state.page_after_update(page, stats)  # the HTML page (docs/runs.md, "See one step")
            # --- 3. metrics, held-out eval, checkpoint (harness/run.py) ---------------------------
            batch = metrics.rollout_stats(task, rollouts, rewards, advantages)
            row = state.log({"step": step, **batch, **stats, "lr": optimizer.param_groups[0]["lr"]},
                            tokens=rollouts.completion_mask.sum().item())
            progress.set_postfix_str(console.progress_line(row))  # reward, pass rate, length
            if state.end_of_step(step):  # evals, saves when due; True after Ctrl-C or --idle-stop
                break
        before, after = state.initial_eval, state.final_eval()

    console.before_after(state, config, len(eval_examples), before, after)  # the table
    if state.exit_code:  # a signal (once the checkpoint is safe: 130, 143, 129) or --idle-stop (3)
        sys.exit(state.exit_code)
    return {"before": before, "after": after, "metrics_path": state.metrics_path}


def main(argv=None):
    """`python train.py [flags]`. argv: the flags (default: sys.argv), or a Config already loaded
    from them. Errors a user can act on are one line (bad input: exit 2; the run's files: 1); any
    other is a bug: its traceback."""
    config = argv if isinstance(argv, Config) else flags.load(argv)  # + a resumed run's
    try:
        return train(config)
    except (InputError, files.RunError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, InputError) else 1)
    except stops.Stopped as stop:  # a signal before the first step: nothing to save
        sys.exit(128 + stop.signum)


if __name__ == "__main__":
    main(command_line)
