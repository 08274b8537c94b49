"""The fast path of train.update_policy: the same update, in less time and memory.

train.update_policy shows Algorithm 1's update as written: one no-grad forward fixes pi_old (and
pi_ref), AR, then for each Lopti pass, epoch and mini-batch the forwards and backwards of its rows
with a gradient (micro_batch at a time), a clip and a step. This file takes the same steps
(tests/test_update.py holds the two equal, weights and stats) and adds:

  1. rows without a gradient (advantage 0 and no KL) are not scored for pi_old either;
  2. the speed rule: when nothing reads p_old before the loss (no AR, no Lopti, one optimizer
     step), each training forward's detached log-probs are pi_old, so no pi_old forward runs;
  3. the log-probs of fast/logprobs.py under --dtype's autocast (precision.py), --logprob-fp32;
     the entropy (a metric) only in the forwards at pi_old's weights;
  4. --loss-agg token-mean-per-micro-batch (the official codes' loss; its chunks stay inside the
     mini-batch's micro-batches: forward_chunks);
  5. --step-in-backward (harness/lean_optimizer.py): the optimizer steps inside backward, so no
     global norm is clipped;
  6. the stats kept on the device and read once (ppo.UpdateStats, as train.update_policy).

Nothing here imports rollout.py or train.py.
"""
import contextlib

import torch

from fast.logprobs import token_logprobs
from fast.precision import precision
from lopti import lopti_passes, reweight_advantages
from ppo import UpdateStats, policy_loss, rows_with_gradient, token_weights


def no_clock(name):  # clock(name) -> a context timing one phase; benchmarks pass a real one
    return contextlib.nullcontext()


def update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages,
                  config, *, ref_model=None, old_logprobs=None, clock=no_clock):
    """Train on one batch (Algorithm 1 after the advantages) -> stats (python floats), the keys
    and values of train.update_policy's. input_ids, attention_mask [B, P+T]; completion_mask
    [B, T]; advantages [B]; old_logprobs [B, T] or None."""
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    mask, advantages = completion_mask.to(device).float(), advantages.to(device)

    def logprobs_of(policy, rows, with_entropy=False):  # [rows, T] log-probs, entropy or None
        with clock("log-prob forward"), precision(device, config.dtype):
            scored = token_logprobs(policy, input_ids[rows], attention_mask[rows], mask[rows],
                                  temperature=config.temperature, micro_batch=config.micro_batch,
                                  logit_chunk=config.logit_chunk, fp32_head=True,
                                  body_autocast=not config.logprob_fp32, share_prompts=True,
                                  with_entropy=with_entropy)
        return scored if with_entropy else (scored, None)

    # 1. pi_ref and pi_old of the sampled tokens, fixed before any update (rows with a gradient)
    learns = mask.any(1) & ((advantages != 0) | (ref_model is not None))  # [B] bool
    active = learns.nonzero().squeeze(1)
    with torch.no_grad():
        ref_logprobs = None if ref_model is None else logprobs_of(ref_model, slice(None))[0]
    old_logprobs, old_probs, entropy = fixed_pi_old(model, logprobs_of, active, mask,
                                                    old_logprobs, config)

    # 2. AR, once per batch: token advantages A_t = (alpha p_old + 1 - alpha) A
    token_adv = reweight_advantages(advantages, old_probs, mask, config.alpha)  # [B, T]

    # 3. Lopti's passes (low-probability tokens first), each ppo_epochs x mini_batches steps
    stats, entropy_parts = UpdateStats(), []  # entropy_parts: the first step's (no pi_old forward)
    passes = lopti_passes(token_adv, old_probs, mask, config.lopti_eta, config.lopti_order)
    for name, pass_adv, pass_mask in passes:
        trained = rows_with_gradient(pass_adv, pass_mask, kl=ref_model is not None)  # [B] bool
        for epoch in range(config.ppo_epochs):
            for mini_batch, rows in mini_batches_with_gradient(trained, config.mini_batches):
                weights = token_weights(mask[mini_batch], config.loss_agg, config.max_new_tokens,
                                        config.micro_batch)  # the mini-batch's loss, per token
                optimizer.zero_grad(set_to_none=True)
                for micro in forward_chunks(rows, mini_batch, config.loss_agg, config.micro_batch):
                    logprobs, micro_entropy = logprobs_of(  # entropy: at pi_old's weights only
                        model, micro, with_entropy=entropy is None and not stats.steps)
                    old = logprobs.detach() if old_logprobs is None else old_logprobs[micro]
                    loss, loss_stats = policy_loss(
                        logprobs, old, pass_adv[micro], mask[micro], clip_low=config.clip_low,
                        clip_high=config.clip_high, dual_clip=config.dual_clip,
                        kl_coef=config.kl_coef, kl_clamp=config.kl_clamp, kl_mask=pass_mask[micro],
                        ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro],
                        weights=weights[micro - mini_batch[0]])
                    loss.backward()  # the chunks' losses add up to the mini-batch's
                    stats.add(loss_stats, loss, mask[micro], pass_mask[micro])
                    if micro_entropy is not None:
                        entropy_parts.append((micro_entropy, mask[micro]))
                stats.step(optimizer.grad_norm() if config.step_in_backward else  # no clip
                           torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
                optimizer.step()
    if entropy is None:  # measured in the first step's forwards instead, at pi_old's weights
        entropy = [torch.cat(parts) for parts in zip(*entropy_parts)] or (mask[:0], mask[:0])
    return stats.result(*entropy, passes, learns, mask)


def fixed_pi_old(model, logprobs_of, rows, mask, old_logprobs, config):
    """(log pi_old, p_old [B, T], (pi_old's entropy, mask) of `rows`) of the sampled tokens,
    fixed before the batch's first update, or (None, None, None): the speed rule. When nothing reads
    p_old before the loss (no AR, no Lopti, one optimizer step), each training forward's detached
    log-probs are pi_old, so no pi_old forward runs (docs/performance.md). Otherwise one no-grad
    forward of `rows` (those that can get a gradient) fixes it; the other rows keep p_old 1.
    old_logprobs: the caller's pi_old, taken as it is (entropy None: the first step measures it)."""
    reads_p_old = config.alpha + config.lopti_eta > 0 or config.ppo_epochs * config.mini_batches > 1
    entropy = None
    if old_logprobs is None and reads_p_old:
        with torch.no_grad():
            scored, token_entropy = logprobs_of(model, rows, with_entropy=True)
            old_logprobs = torch.zeros_like(mask).index_put((rows,), scored)
            entropy = token_entropy, mask[rows]
    if old_logprobs is None:
        return None, None, None
    old_logprobs = old_logprobs.to(mask.device)
    return old_logprobs, old_logprobs.exp(), entropy


def mini_batches_with_gradient(trained, count):
    """The batch's rows in `count` contiguous mini-batches -> [(mini_batch, its rows with a
    gradient)], leaving out a mini-batch with none: nothing to learn, so no optimizer step (AdamW
    would still move the weights)."""
    splits = torch.arange(len(trained), device=trained.device).tensor_split(count)
    return [(mini_batch, mini_batch[trained[mini_batch]])
            for mini_batch in splits if trained[mini_batch].any()]


def forward_chunks(rows, mini_batch, loss_agg, micro_batch):
    """The trained rows of a mini-batch, micro_batch at a time (token-mean-per-micro-batch: within
    the mini-batch's own micro-batches, so no chunk mixes two of their token means)."""
    if loss_agg != "token-mean-per-micro-batch":
        return rows.split(micro_batch)
    chunks = [micro[torch.isin(micro, rows)] for micro in mini_batch.split(micro_batch)]
    return [chunk for chunk in chunks if len(chunk)]
