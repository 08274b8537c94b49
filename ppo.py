"""The clipped PPO/GRPO surrogate with a k3 KL to a reference policy (DESIGN.md section 4).

Per token, with ratio = exp(logp - old_logp):

    l = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))    clip-higher (DAPO)
    l = min(l, -A * dual_clip)  where A < 0                                 optional dual clip
    loss = sum(weights * (l + kl_coef * k3))  k3 = exp(ref - logp) - (ref - logp) - 1

Why the loss sits near 0 while training moves: right after sampling ratio = 1, so l = -A, whose
mean over a group is ~0; its gradient, -(1/N) sum_t A_t grad logp_t, is the policy gradient itself.
"""
import torch

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
             "token-mean-per-micro-batch")


def kl_k3(logprobs, ref_logprobs, log_ratio_clamp=20.0):
    """k3 = exp(d) - d - 1 with d = ref - logp, per token [B, T] -> [B, T]: non-negative, and an
    unbiased estimate of KL(pi || pi_ref) until the clamps act: d is clamped to +-log_ratio_clamp
    and k3 to at most 10, so one collapsed token cannot dominate the loss (biased there: DESIGN.md
    section 4)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


def token_weights(completion_mask, loss_agg="token-mean", norm_constant=None, micro_batch=None):
    """Each token's weight in the loss, [B, T] (0 outside completion_mask), by loss_agg: the loss
    is sum(weights * l). Computed once over a whole mini-batch, so that the loss of any split of its
    rows into chunks is the sum of the chunks' sum(weights * l): gradient accumulation, exactly.

    token-mean               1 / the valid tokens (default)
    seq-mean-token-mean      1 / (B * the row's valid tokens)  (original GRPO)
    seq-mean-token-sum       1 / B
    seq-mean-token-sum-norm  1 / (B * norm_constant)  (Dr. GRPO; default T)
    token-mean-per-micro-batch  1 / (the micro-batch's valid tokens * the number of micro-batches):
                             the mean of each micro_batch rows' token means (verl's; default one)
    """
    mask = completion_mask.float()
    B, T = mask.shape
    if loss_agg == "token-mean":
        return mask / mask.sum().clamp_min(1.0)
    if loss_agg == "seq-mean-token-mean":
        return mask / mask.sum(dim=1, keepdim=True).clamp_min(1.0) / B
    if loss_agg == "seq-mean-token-sum":
        return mask / B
    if loss_agg == "seq-mean-token-sum-norm":
        norm = T if norm_constant is None else norm_constant
        if not norm > 0:
            raise ValueError(f"norm_constant must be > 0, got {norm!r}")
        return mask / B / norm
    if loss_agg == "token-mean-per-micro-batch":
        parts = mask.split(micro_batch or B)
        return torch.cat([part / part.sum().clamp_min(1.0) / len(parts) for part in parts])
    raise ValueError(f"unknown loss_agg {loss_agg!r}; choose from {', '.join(LOSS_AGGS)}")


def clipped_token_loss(logprobs, old_logprobs, advantages, *, clip_low=0.2, clip_high=0.28,
                       dual_clip=None):
    """l = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high)),
    ratio = exp(logp - old_logp); with dual_clip = c > 1, l = min(l, -A * c) where A < 0.
    [B, T] in, [B, T] out, no mask, no reduction; advantages [B, T] or [B, 1]; logprobs carries the
    gradient."""
    ratio = torch.exp(logprobs - old_logprobs)
    token_loss = torch.maximum(-advantages * ratio,
                               -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))
    if dual_clip is not None:
        token_loss = torch.where(advantages < 0, torch.minimum(token_loss, -advantages * dual_clip),
                                 token_loss)
    return token_loss


def clip_masks(ratio, advantages, completion_mask, *, clip_low=0.2, clip_high=0.28):
    """The tokens whose ratio the clip holds (their gradient is 0), bool [B, T] each:
    low = valid & A < 0 & ratio < 1 - clip_low,  high = valid & A > 0 & ratio > 1 + clip_high."""
    valid = completion_mask.bool()
    return (valid & (advantages < 0) & (ratio < 1.0 - clip_low),
            valid & (advantages > 0) & (ratio > 1.0 + clip_high))


def policy_loss(logprobs, old_logprobs, advantages, completion_mask, *, clip_low=0.2,
                clip_high=0.28, dual_clip=None, ref_logprobs=None, kl_coef=0.0, kl_clamp=20.0,
                kl_mask=None, loss_agg="token-mean", norm_constant=None, weights=None):
    """loss = sum(weights * (clipped_token_loss + kl_coef * k3)) -> (loss, stats: 0-dim tensors).
    logprobs [B, T] (carries the gradient), old_logprobs [B, T] (detached), advantages [B] or
    [B, T]; completion_mask [B, T]. weights [B, T]: each token's weight (token_weights), default
    token_weights(completion_mask, loss_agg, norm_constant) over these rows; a chunk of a mini-batch
    passes its rows of the mini-batch's weights. kl_mask [B, T]: the tokens that carry the KL
    (default all valid; a Lopti pass passes its own). stats: clip_frac_low, clip_frac_high,
    ratio_mean, ratio_max over the valid tokens; pg_loss; dual_clip_frac with dual_clip; kl with a
    reference (merge_stats joins a mini-batch's chunks' stats).
    """
    advantages = _check_loss_inputs(logprobs, old_logprobs, advantages, completion_mask, loss_agg,
                                    dual_clip)
    mask, advantages = completion_mask.bool(), advantages.to(logprobs.dtype)

    token_loss = clipped_token_loss(logprobs, old_logprobs, advantages, clip_low=clip_low,
                                    clip_high=clip_high, dual_clip=dual_clip)
    if weights is None:
        weights = token_weights(mask, loss_agg, norm_constant)
    token_loss = torch.where(mask, token_loss, 0.0)  # where, not *: padding's NaN cannot leak
    pg_loss = (weights * token_loss).sum()
    loss, stats = pg_loss, {}
    if ref_logprobs is not None:
        kl_mask = mask if kl_mask is None else kl_mask.bool()
        k3 = torch.where(kl_mask, kl_k3(logprobs, ref_logprobs, kl_clamp), 0.0)
        loss = loss + kl_coef * (weights * k3).sum()  # weighted as the valid tokens
        stats["kl"] = (k3.sum() / kl_mask.sum().clamp_min(1)).detach()

    with torch.no_grad():
        ratio = torch.exp(logprobs - old_logprobs)
        n_valid = mask.sum().clamp_min(1)
        clipped_low, clipped_high = clip_masks(ratio, advantages, mask, clip_low=clip_low,
                                               clip_high=clip_high)
        stats["clip_frac_low"] = clipped_low.sum() / n_valid
        stats["clip_frac_high"] = clipped_high.sum() / n_valid
        if dual_clip is not None:  # tokens whose loss the dual clip capped
            uncapped = clipped_token_loss(logprobs, old_logprobs, advantages, clip_low=clip_low,
                                          clip_high=clip_high)
            capped = mask & (advantages < 0) & (uncapped > -advantages * dual_clip)
            stats["dual_clip_frac"] = capped.sum() / n_valid
        stats["ratio_mean"] = torch.where(mask, ratio, 0.0).sum() / n_valid
        stats["ratio_max"] = torch.where(mask, ratio, 0.0).max()
        stats["pg_loss"] = pg_loss.detach()
    return loss, stats


def merge_stats(chunks):
    """[(stats, completion_mask, kl_mask)] of one optimizer step's forward chunks (policy_loss's
    stats, loss added) -> the step's stats, as one forward of all their rows would give them: token
    means weighted by the chunk's valid tokens (kl: its KL tokens), pg_loss and loss summed,
    ratio_max the max. 0-dim tensors (no sync)."""
    merged = {}
    for key in chunks[0][0]:
        values = torch.stack([stats[key] for stats, _, _ in chunks])
        if key in ("ratio_max", "pg_loss", "loss"):
            merged[key] = values.max() if key == "ratio_max" else values.sum()
            continue
        counts = torch.stack([(kl if key == "kl" else mask).sum() for _, mask, kl in chunks])
        merged[key] = (values * counts.to(values.dtype)).sum() / counts.sum().clamp_min(1)
    return merged


def rows_with_gradient(pass_advantages, pass_mask, *, kl):
    """[B] bool: rows whose loss has a gradient in this pass (a non-zero advantage, or KL on any of
    its tokens). The others need no forward: their loss is 0 and constant, though they still count
    in the mini-batch's token_weights."""
    return (pass_advantages != 0).any(1) | (kl & pass_mask.any(1))


# The checks a copier's bad input meets (one place, not ahead of each formula)
def _check_loss_inputs(logprobs, old_logprobs, advantages, completion_mask, loss_agg, dual_clip):
    """advantages as [B, 1] or [B, T]; a ValueError naming the input that does not fit."""
    advantages = advantages[:, None] if advantages.dim() == 1 else advantages
    B, T = logprobs.shape if logprobs.dim() == 2 else (None, None)
    if B is None or old_logprobs.shape != logprobs.shape or completion_mask.shape != logprobs.shape:
        raise ValueError(f"logprobs, old_logprobs, completion_mask must share shape [B, T]; got "
                         f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, "
                         f"{tuple(completion_mask.shape)}")
    if advantages.dim() != 2 or advantages.shape[0] != B or advantages.shape[1] not in (1, T):
        raise ValueError(f"advantages must have shape [B] or [B, T] = {(B, T)}, got "
                         f"{tuple(advantages.shape)}")
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; choose from {', '.join(LOSS_AGGS)}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip!r}")
    return advantages
