"""The fast path of train.update_policy: the same update, in less time and memory.

train.update_policy shows Algorithm 1's update as written: one no-grad forward fixes pi_old (and
pi_ref), AR, then for each Lopti pass, epoch and mini-batch one forward, backward, clip and step.
This file takes the same steps (tests/test_train.py holds the two equal) and adds:

  1. micro-batches: a mini-batch's rows go through forward and backward micro_batch at a time, each
     chunk's loss weighted by its share of the mini-batch's loss (row_shares, forward_chunks);
     --loss-agg token-mean-per-micro-batch (the official codes' loss) exists only here;
  2. rows without a gradient (advantage 0 and no KL) are neither scored for pi_old nor forwarded;
  3. the speed rule: when nothing reads p_old before the loss (no AR, no Lopti, one optimizer step),
     each training forward's detached log-probs are pi_old, so no pi_old forward runs;
  4. the log-probs of fast/logprobs.py under --dtype's autocast (precision.py), --logprob-fp32;
  5. --step-in-backward (harness/lean_optimizer.py): the optimizer steps inside backward, so no
     global norm is clipped;
  6. the loss's statistics summed on the device and read once (step_stats.py).

Nothing here imports rollout.py or train.py.
"""
import contextlib

import torch

from fast.logprobs import token_logprobs
from fast.precision import precision
from fast.step_stats import StepStats
from lopti import lopti_passes, reweight_advantages
from ppo import policy_loss


def no_clock(name):  # clock(name) -> a context timing one phase; benchmarks pass a real one
    return contextlib.nullcontext()


def update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages,
                  config, *, ref_model=None, old_logprobs=None, clock=no_clock):
    """Train on one batch (Algorithm 1 after the advantages) -> stats (python floats). input_ids,
    attention_mask [B, P+T]; completion_mask [B, T]; advantages [B]; old_logprobs [B, T] or None."""
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    mask, advantages = completion_mask.to(device).float(), advantages.to(device)

    def logprobs_of(policy, rows, with_entropy=False):  # [rows, T] log-probs of the sampled tokens
        with clock("log-prob forward"), precision(device, config.dtype):
            return token_logprobs(policy, input_ids[rows], attention_mask[rows], mask[rows],
                                  temperature=config.temperature, micro_batch=config.micro_batch,
                                  logit_chunk=config.logit_chunk, fp32_head=True,
                                  body_autocast=not config.logprob_fp32, share_prompts=True,
                                  with_entropy=with_entropy)

    # 1. pi_ref and pi_old of the sampled tokens, fixed before any update (rows with a gradient)
    active = (mask.any(1) & ((advantages != 0) | (ref_model is not None))).nonzero().squeeze(1)
    with torch.no_grad():
        ref_logprobs = None if ref_model is None else logprobs_of(ref_model, slice(None))
    old_logprobs, old_probs = fixed_pi_old(model, logprobs_of, active, mask, old_logprobs, config)

    # 2. AR, once per batch: token advantages A_t = (alpha p_old + 1 - alpha) A
    token_adv = reweight_advantages(advantages, old_probs, mask, config.alpha)  # [B, T]

    # 3. Lopti's passes (low-probability tokens first), each ppo_epochs x mini_batches steps
    stats = StepStats()  # the loss's stats, summed on the device (step_stats.py)
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
    gradient) fixes it; the other rows keep p_old 1. old_logprobs: the caller's pi_old, taken as it is."""
    reads_p_old = config.alpha + config.lopti_eta > 0 or config.ppo_epochs * config.mini_batches > 1
    if old_logprobs is None and reads_p_old:
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


# How a mini-batch's loss splits over forward chunks (micro-batches): the loss_agg rule's other half
def row_shares(completion_mask, mini_batch, loss_agg, micro_batch):
    """[B] each row's weight in its mini-batch's loss: tokens / the mini-batch's tokens (token-mean);
    tokens / its micro-batch's tokens / the number of micro-batches (token-mean-per-micro-batch: verl's
    micro-batches of micro_batch rows); else 1 / rows. The chunks' losses times their shares sum to the
    mini-batch's loss."""
    share = torch.zeros(len(completion_mask), device=completion_mask.device)
    tokens = completion_mask[mini_batch].sum(1)
    if loss_agg == "token-mean":
        share[mini_batch] = tokens / tokens.sum().clamp_min(1)
    elif loss_agg == "token-mean-per-micro-batch":
        parts = tokens.split(micro_batch)
        share[mini_batch] = torch.cat([part / part.sum().clamp_min(1) / len(parts)
                                       for part in parts])
    else:
        share[mini_batch] = 1.0 / len(mini_batch)
    return share


def forward_chunks(rows, mini_batch, loss_agg, micro_batch):
    """The trained rows of a mini-batch, micro_batch at a time (token-mean-per-micro-batch: within the
    mini-batch's own micro-batches, so no chunk mixes two of their token means)."""
    if loss_agg != "token-mean-per-micro-batch":
        return rows.split(micro_batch)
    chunks = [micro[torch.isin(micro, rows)] for micro in mini_batch.split(micro_batch)]
    return [chunk for chunk in chunks if len(chunk)]
