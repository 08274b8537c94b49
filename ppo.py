"""The clipped PPO/GRPO surrogate with a k3 KL to a reference policy (DESIGN.md section 4).

Per token, with ratio = exp(logp - old_logp):

    l = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))    clip-higher (DAPO)
    l = min(l, -A * dual_clip)  where A < 0                                 optional dual clip
    loss = aggregate(l + kl_coef * k3)        k3 = exp(ref - logp) - (ref - logp) - 1

Why the loss sits near 0 while training moves: right after sampling ratio = 1, so l = -A, whose
mean over a group is ~0; its gradient, -(1/N) sum_t A_t grad logp_t, is the policy gradient itself.
"""
import torch

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
             "token-mean-per-micro-batch")


def kl_k3(logprobs, ref_logprobs, log_ratio_clamp=20.0):
    """k3 = exp(d) - d - 1 with d = ref - logp: an unbiased, non-negative estimate of
    KL(pi || pi_ref) per token, [B, T] -> [B, T]. d is clamped to +-log_ratio_clamp and k3 to
    [-10, 10], so one collapsed token cannot dominate the loss (DESIGN.md section 4)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


def aggregate(token_values, completion_mask, loss_agg="token-mean", norm_constant=None):
    """Per-token values [B, T] (zero outside completion_mask) -> a scalar, by loss_agg:

    token-mean               sum over the valid tokens / their number (default)
    seq-mean-token-mean      mean over sequences of each one's token mean (original GRPO)
    seq-mean-token-sum       mean over sequences of each one's token sum
    seq-mean-token-sum-norm  mean over sequences of token sum / norm_constant (Dr. GRPO; default T)
    token-mean-per-micro-batch  token-mean of one micro-batch (fast/update.py averages them)
    """
    mask = completion_mask.to(token_values.dtype)
    B, T = token_values.shape
    if loss_agg in ("token-mean", "token-mean-per-micro-batch"):
        return token_values.sum() / mask.sum().clamp_min(1.0)
    if loss_agg == "seq-mean-token-mean":
        return (token_values.sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)).mean()
    if loss_agg == "seq-mean-token-sum":
        return token_values.sum(dim=1).mean()
    if loss_agg == "seq-mean-token-sum-norm":
        norm_constant = T if norm_constant is None else norm_constant
        return token_values.sum(dim=1).mean() / _positive(norm_constant, "norm_constant")
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
                kl_mask=None, loss_agg="token-mean", norm_constant=None):
    """loss = aggregate(clipped_token_loss + kl_coef * k3) -> (loss, stats: detached 0-dim tensors).

    logprobs [B, T] (carries the gradient), old_logprobs [B, T] (detached), advantages [B] or
    [B, T]; completion_mask [B, T] alone sets the denominator. kl_mask [B, T]: the tokens that carry
    the KL (default all valid; a Lopti pass passes its own). stats: clip_frac_low, clip_frac_high,
    ratio_mean, ratio_max, pg_loss over the valid tokens; dual_clip_frac with dual_clip; kl with a
    reference.
    """
    advantages = _check_loss_inputs(logprobs, old_logprobs, advantages, completion_mask, loss_agg,
                                    dual_clip)
    mask = completion_mask.bool()
    advantages = advantages.to(logprobs.dtype)

    token_loss = clipped_token_loss(logprobs, old_logprobs, advantages, clip_low=clip_low,
                                    clip_high=clip_high, dual_clip=dual_clip)
    token_loss = torch.where(mask, token_loss, 0.0)  # where, not *: padding's NaN cannot leak
    pg_loss = aggregate(token_loss, mask, loss_agg, norm_constant)
    loss = pg_loss
    stats = {}
    if ref_logprobs is not None:
        kl_mask = mask if kl_mask is None else kl_mask.bool()
        k3 = torch.where(kl_mask, kl_k3(logprobs, ref_logprobs, kl_clamp), 0.0)
        loss = loss + kl_coef * aggregate(k3, mask, loss_agg, norm_constant)  # all valid tokens
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


def _positive(value, name):
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value
