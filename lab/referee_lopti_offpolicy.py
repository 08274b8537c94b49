"""Item 5 of the Lopti referee's questions (issue 30), the clipped case: the token weight w per p_old quartile in
the OFF-policy state, where the trust-region indicator can be 0. lab.referee_lopti measures it on each of its
batches (its --no-off-policy skips it; --clip-low, --clip-high, --dual-clip set the clip) and writes
referee_lopti_offpolicy.csv; the batch, the tokens measured, their p_old quartiles and w are that script's docstring's.

On-policy no token leaves the trust region, so a copy of the policy takes train.py's first optimizer step of the
batch (train.update_policy on its first of 2 mini-batches, with the checkpoint run's settings from run.json, the
clip's overridable, and AdamW's saved moments where the checkpoint has them); the batch is scored again (ratio =
pi_new / pi_old per token), and per on-policy p_old quartile it counts the tokens whose trust-region indicator is 0
(clipped low, clipped high, dual-clipped) and the A < 0 tokens above 1 + clip_high, which the clip does not hold.
w is read from autograd of ppo.policy_loss itself (loss_token_weights: -N d loss / d log pi_t), so "w = 0 where the
indicator is 0" is measured: exactly 0 with beta = 0; the KL part beta (pi_ref / pi - 1) remains with beta > 0. Per
quartile: those counts, mean |w| inside, max |w| on the clipped ones, the ratio's range.
offpolicy_metrics turns several batches' rows into the numbers a results file ships (lab.reproduce).
"""
import copy
import json
import math
import os

import torch

import train
from harness.checkpoint import load_trainer_state
from harness.config import Config
from harness.files import RunError
from experiments.lopti_token_stats import NUM_GROUPS
from lab.seed_stats import interval_text, mean_se_interval
from ppo import clip_masks, policy_loss
from rollout import token_logprobs


def trust_region_masks(ratio, advantages, completion_mask, *, clip_low, clip_high, dual_clip=None):
    """Where the trust-region indicator is 0 and the surrogate's gradient is cut -> {name: bool [B, T]}:
    "low" A < 0 and ratio < 1 - clip_low, "high" A > 0 and ratio > 1 + clip_high (ppo.clip_masks), "dual" A < 0 and
    ratio > c (the dual clip caps the loss at -A c; all False without one), "inside" the other valid tokens, and
    "neg_above" the A < 0 tokens inside with ratio > 1 + clip_high (not held: |w| = |A| ratio grows).
    ratio, completion_mask [B, T]; advantages [B] or [B, T]."""
    advantages = advantages[:, None] if advantages.dim() == 1 else advantages
    low, high = clip_masks(ratio, advantages, completion_mask, clip_low=clip_low, clip_high=clip_high)
    valid = completion_mask.bool()
    dual = valid & (advantages < 0) & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(valid)
    inside = valid & ~(low | high | dual)
    return {"low": low, "high": high, "dual": dual, "inside": inside,
            "neg_above": inside & (advantages < 0) & (ratio > 1.0 + clip_high)}


def loss_token_weights(logprobs, old_logprobs, advantages, completion_mask, *, ref_logprobs=None, beta=0.0,
                       clip_low, clip_high, dual_clip=None, kl_clamp=20.0):
    """w [B, T], read off train.py's loss by autograd: -N d loss / d log pi_t, with loss = ppo.policy_loss
    (token-mean over the N completion tokens, clipped surrogate + beta k3). So grad loss = -(1/N) sum_t w_t
    grad log pi_t, and w_t = (pi / pi_old) A I_trust + beta (pi_ref / pi - 1) inside k3's clamp: the weight of
    token t whatever the clip did."""
    current = logprobs.detach().clone().requires_grad_(True)
    loss, _ = policy_loss(current, old_logprobs.detach(), advantages, completion_mask, clip_low=clip_low,
                          clip_high=clip_high, dual_clip=dual_clip, kl_clamp=kl_clamp, kl_coef=beta,
                          ref_logprobs=ref_logprobs if beta > 0 else None)
    (grad,) = torch.autograd.grad(loss, current)
    return -grad * completion_mask.sum()


def step_settings(checkpoint, args, defaults):
    """The settings of train.py's step for the off-policy state: the checkpoint run's (its run.json), else
    train.py's defaults with the policy's lr; --clip-low / --clip-high / --dual-clip override -> dict."""
    keys = ("lr", "weight_decay", "grad_clip", "clip_low", "clip_high", "dual_clip", "kl_coef", "kl_clamp", "loss_agg")
    try:
        with open(os.path.join(checkpoint, "run.json")) as f:
            run = json.load(f)
    except (OSError, ValueError):
        run = {}
    settings = {key: run.get(key, getattr(defaults, key)) for key in keys}
    for key in ("clip_low", "clip_high", "dual_clip"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if settings["dual_clip"] is not None and not settings["dual_clip"] > 1:
        settings["dual_clip"] = None  # --dual-clip 0: none
    return settings


def saved_moments(checkpoint):
    """The AdamW state a train.py checkpoint saved (fp32 AdamW runs only), or None."""
    try:
        with open(os.path.join(checkpoint, "run.json")) as f:
            run = json.load(f)
        if run.get("optimizer") != "adamw" or run.get("param_dtype", "fp32") != "fp32":
            return None
        return load_trainer_state(checkpoint)["optimizer"]
    except (OSError, ValueError, KeyError, RunError):
        return None


def off_policy_logprobs(model, batch, advantages, old_logprobs, settings, *, ref_model, moments, temperature,
                        micro_batch):
    """log pi [B, T] of the batch's sampled tokens after train.py's first optimizer step on it (the first of two
    contiguous mini-batches), taken on a copy of `model` -> (log-probs, whether the saved AdamW moments were used)."""
    stepped = copy.deepcopy(model)
    stepped.train()
    optimizer = torch.optim.AdamW(stepped.parameters(), lr=settings["lr"], weight_decay=settings["weight_decay"])
    used = False
    if moments is not None:
        try:
            optimizer.load_state_dict(moments)
            used = all(state["exp_avg"].shape == p.shape for p, state in optimizer.state.items())
        except (ValueError, KeyError, RuntimeError):
            used = False
        if not used:
            optimizer = torch.optim.AdamW(stepped.parameters(), lr=settings["lr"],
                                          weight_decay=settings["weight_decay"])
    config = Config(**{k: v for k, v in settings.items() if k != "lr"}, lr=settings["lr"], temperature=temperature,
                    micro_batch=micro_batch, dtype="fp32", mini_batches=1, ppo_epochs=1)
    first = torch.arange(len(advantages), device=advantages.device).tensor_split(2)[0]
    input_ids, attention_mask, completion_mask = batch
    train.update_batch(stepped, optimizer, input_ids[first], attention_mask[first], completion_mask[first],
                       advantages[first], config, old_logprobs=old_logprobs[first],
                       ref_model=ref_model if settings["kl_coef"] > 0 else None)
    with torch.no_grad():
        new = token_logprobs(stepped, *batch, temperature=temperature, micro_batch=micro_batch)
    del stepped, optimizer
    return new, used



def measure_off_policy(model, batch, advantages, logprobs, ref_logprobs, groups, token_mask, settings, *, seed,
                       betas, ref_model, moments, temperature, micro_batch):
    """One batch's off-policy state -> rows per (beta, mini-batch, quartile) (off_policy_rows, plus "adamw_moments":
    saved or fresh). logprobs: the on-policy log pi_old [B, T]; groups, token_mask: the on-policy p_old quartiles and
    the tokens measured (lab.referee_lopti.measure's); settings: step_settings; moments: saved_moments."""
    mask = batch[2].float()
    new_logprobs, used = off_policy_logprobs(model, batch, advantages, logprobs, settings, ref_model=ref_model,
                                             moments=moments, temperature=temperature, micro_batch=micro_batch)
    ratio = (new_logprobs - logprobs).exp()
    masks = trust_region_masks(ratio, advantages, mask, clip_low=settings["clip_low"],
                               clip_high=settings["clip_high"], dual_clip=settings["dual_clip"])
    off_rows = []
    for beta in betas:
        weights = loss_token_weights(new_logprobs, logprobs, advantages, mask, ref_logprobs=ref_logprobs,
                                     beta=beta, clip_low=settings["clip_low"], clip_high=settings["clip_high"],
                                     dual_clip=settings["dual_clip"], kl_clamp=settings["kl_clamp"])
        off_rows += [{**row, "adamw_moments": "saved" if used else "fresh"}
                     for row in off_policy_rows(seed, beta, groups, token_mask, ratio, advantages, weights, masks)]
    return off_rows


def off_policy_rows(seed, beta, groups, token_mask, ratio, advantages, weights, masks):
    """Per mini-batch (1: the rows train.py stepped on, rescored as a second PPO epoch would; 2: the rows its
    second, off-policy step trains) and p_old quartile of the off-policy state -> rows: tokens, how many the clip
    holds (low / high / dual), how many A < 0 tokens sit above 1 + clip_high unclipped, mean |w| inside, max |w|
    where the indicator is 0, the ratio's range (nan where a part of a quartile has no token)."""
    rows = []
    cut = masks["low"] | masks["high"] | masks["dual"]
    halves = torch.arange(len(advantages), device=advantages.device).tensor_split(2)
    for part, half in enumerate(halves, start=1):
        in_part = torch.zeros_like(token_mask)
        in_part[half] = token_mask[half]
        rows += quartile_rows(seed, beta, part, groups, in_part, ratio, advantages, weights, masks, cut)
    return rows


def quartile_rows(seed, beta, part, groups, token_mask, ratio, advantages, weights, masks, cut):
    def largest(values):
        return values.abs().max().item() if len(values) else math.nan

    rows = []
    for q in range(NUM_GROUPS):
        in_q = (groups == q) & token_mask
        inside, clipped = in_q & masks["inside"], in_q & cut
        rows.append({"seed": seed, "beta": beta, "mini_batch": part, "quartile": q + 1, "tokens": int(in_q.sum()),
                     "clipped_low": int((in_q & masks["low"]).sum()), "clipped_high": int((in_q & masks["high"]).sum()),
                     "dual_clipped": int((in_q & masks["dual"]).sum()), "inside": int(inside.sum()),
                     "neg_above_clip_high": int((in_q & masks["neg_above"]).sum()),
                     "mean_abs_w_inside": weights[inside].abs().mean().item() if inside.any() else math.nan,
                     "max_abs_w_clipped": largest(weights[clipped]),
                     "max_abs_w_neg_above": largest(weights[in_q & masks["neg_above"]]),
                     "ratio_min": ratio[in_q].min().item() if in_q.any() else math.nan,
                     "ratio_max": ratio[in_q].max().item() if in_q.any() else math.nan})
    return rows


OFFPOLICY_KEYS = ("tokens", "clipped_low", "clipped_high", "dual_clipped", "neg_above_clip_high")


def offpolicy_metrics(rows, prefix="", keys=OFFPOLICY_KEYS, weights=True):
    """The off-policy rows of several batches -> {metric: value}, the numbers a results file ships: per mini-batch m
    and quartile q, "mb{m}_Q{q}_" + each of `keys` (counts summed over the batches); with `weights`, also
    max_abs_w_clipped_beta{beta}, max_abs_w_neg_above and ratio_max (the largest over the batches), ratio_min (the
    smallest), and for mini-batch 2 (the
    rows train.py trains off-policy) mean_abs_w_inside at beta 0 (the mean over the batches of each batch's mean)
    with its SE over them (_se). A value that does not exist (no token clipped, a single batch's SE) is left out,
    not written as nan."""
    metrics = {}

    def largest(name, values):
        values = [v for v in values if not math.isnan(v)]
        if values:
            metrics[name] = round(max(values), 6)

    for (part, q) in sorted({(int(r["mini_batch"]), int(r["quartile"])) for r in rows}):
        name = f"{prefix}mb{part}_Q{q}_"
        cells = [r for r in rows if (int(r["mini_batch"]), int(r["quartile"])) == (part, q)]
        beta0 = [r for r in cells if r["beta"] == 0]  # every run measures beta 0; the counts do not depend on beta
        for key in keys:
            metrics[name + key] = int(sum(r[key] for r in beta0))
        if not weights:
            continue
        for beta in sorted({r["beta"] for r in cells}):
            largest(f"{name}max_abs_w_clipped_beta{beta:g}",
                    [r["max_abs_w_clipped"] for r in cells if r["beta"] == beta])
        largest(name + "max_abs_w_neg_above", [r["max_abs_w_neg_above"] for r in beta0])
        largest(name + "ratio_max", [r["ratio_max"] for r in beta0])
        lows = [r["ratio_min"] for r in beta0 if not math.isnan(r["ratio_min"])]
        if lows:
            metrics[name + "ratio_min"] = round(min(lows), 6)
        inside = [r["mean_abs_w_inside"] for r in beta0 if not math.isnan(r["mean_abs_w_inside"])]
        if part == 2 and inside:
            mean, se, _ = mean_se_interval(inside)
            metrics[name + "mean_abs_w_inside"] = round(mean, 6)
            if se is not None:
                metrics[name + "mean_abs_w_inside_se"] = round(se, 6)
    return metrics


def nan_last(x):
    return math.inf if math.isnan(x) else x


def nan_first(x):
    return -math.inf if math.isnan(x) else x


def summarize_off_policy(rows, settings):
    """Print, per beta and quartile, the off-policy state's counts summed over the batches, mean |w| inside
    (mean ± SE over the batches) and the largest |w| where the indicator is 0."""
    for beta, part in dict.fromkeys((r["beta"], r["mini_batch"]) for r in rows):
        mine = [r for r in rows if r["beta"] == beta and r["mini_batch"] == part]
        seeds = sorted({r["seed"] for r in mine})
        print(f"\nmini-batch {part} of 2 ({'stepped on, rescored' if part == 1 else 'train.py trains it off-policy'}), "
              f"off-policy (after train.py's first of 2 mini-batch steps; clip {settings['clip_low']:g} / "
              f"{settings['clip_high']:g}, dual clip {settings['dual_clip']}, lr {settings['lr']:g}, AdamW moments "
              f"{'/'.join(sorted({r['adamw_moments'] for r in mine}))}), beta = {beta:g}, batches {seeds}: counts "
              "summed over the batches; mean |w| inside: mean ± SE over the batches")
        print("| quartile | tokens | clipped low (A<0) | clipped high (A>0) | dual-clipped | A<0 above 1+clip_high "
              "| ratio range | mean \\|w\\| inside | max \\|w\\| where clipped |")
        print("|---|---|---|---|---|---|---|---|---|")
        for q in range(1, NUM_GROUPS + 1):
            cells = [r for r in mine if r["quartile"] == q]
            clipped = [r["max_abs_w_clipped"] for r in cells if not math.isnan(r["max_abs_w_clipped"])]
            inside = [r["mean_abs_w_inside"] for r in cells if not math.isnan(r["mean_abs_w_inside"])]
            print(f"| Q{q} | {sum(r['tokens'] for r in cells)} | {sum(r['clipped_low'] for r in cells)} | "
                  f"{sum(r['clipped_high'] for r in cells)} | {sum(r['dual_clipped'] for r in cells)} | "
                  f"{sum(r['neg_above_clip_high'] for r in cells)} | "
                  f"{min((r['ratio_min'] for r in cells), key=nan_last):.4g}-"
                  f"{max((r['ratio_max'] for r in cells), key=nan_first):.4g} | "
                  f"{interval_text(inside) if inside else 'none inside'} | "
                  f"{f'{max(clipped):.3g}' if clipped else 'none clipped'} |")
