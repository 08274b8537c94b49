"""The clipped PPO/GRPO surrogate with k3 KL to a reference policy (DESIGN.md section 4).

Per token, with ratio = exp(logp - old_logp):

    l = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))    clip-higher (DAPO)
    l = min(l, -A * dual_clip)  where A < 0                                 optional dual clip
    loss = aggregate(l + kl_coef * k3)        k3 = exp(ref - logp) - (ref - logp) - 1

Why is the loss ~0 on the first minibatch while training still moves?  Right after sampling,
logp == old_logp, so ratio = 1 and l = -A on every token. Advantages sum to 0 within a group
(softmax, grpo, rloo, ...), so the token-mean of -A is 0 up to differences in completion length,
and k3 = 0 when the policy equals the reference. The gradient is not 0:
d ratio / d theta = ratio * grad logp, so grad loss = -(1/N) sum_t A_t grad logp_t, the policy
gradient itself. Watch the reward and the clip fractions, not the loss value.
"""
import torch

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
             "token-mean-per-micro-batch")


def kl_k3(logprobs, ref_logprobs, log_ratio_clamp=20.0):
    """k3 estimator of KL(pi || pi_ref) per token: exp(d) - d - 1 with d = ref - logp,
    [B, T] -> [B, T].

    Unbiased for the KL under samples from pi and always >= 0 (0 exactly where logp == ref).
    d is clamped to [-log_ratio_clamp, log_ratio_clamp] (verl and the SoftmaxGRPO runs: 20; the
    AR-Lopti code: 5) and the value to [-10, 10], so a single token whose probability collapsed
    cannot dominate the loss (the clamps also stop that token's gradient). DESIGN.md section 4.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


def aggregate(token_values, completion_mask, loss_agg="token-mean", norm_constant=None):
    """Reduce per-token values [B, T] (already zero outside completion_mask) to a scalar.

    token-mean               sum over all valid tokens / number of valid tokens in the batch
                             (default)
    token-mean-per-micro-batch  the same on one micro-batch; the trainer averages the micro-batches'
                             means with equal weights
                             (verl 0.6.1 and the AR-Lopti fork: train.row_shares)
    seq-mean-token-mean      mean over sequences of (per-sequence token mean) (original GRPO)
    seq-mean-token-sum       mean over sequences of (per-sequence token sum)
    seq-mean-token-sum-norm  mean over sequences of (token sum / norm_constant)
                             (Dr. GRPO; default T)
    Note: verl's seq-mean-token-sum-norm divides the batch total by T without the mean over
    sequences.
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
        if not norm_constant > 0:
            raise ValueError(f"norm_constant must be > 0, got {norm_constant!r}")
        return token_values.sum(dim=1).mean() / norm_constant
    raise ValueError(f"unknown loss_agg {loss_agg!r}; choose from {', '.join(LOSS_AGGS)}")


def clipped_token_loss(logprobs, old_logprobs, advantages, *, clip_low=0.2, clip_high=0.28,
                       dual_clip=None):
    """The clipped surrogate per token (DESIGN.md section 4): [B, T] in, [B, T] out, no masking,
    no reduction.

    ratio = exp(logprobs - old_logprobs);
    l = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
    and, with dual_clip = c > 1, l = min(l, -A * c) where A < 0 (caps the loss of a
    negative-advantage token whose ratio exploded).
    logprobs carries the gradient; old_logprobs is detached; advantages [B, T] or [B, 1].
    """
    ratio = torch.exp(logprobs - old_logprobs)
    token_loss = torch.maximum(-advantages * ratio,
                               -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))
    if dual_clip is not None:
        token_loss = torch.where(advantages < 0, torch.minimum(token_loss, -advantages * dual_clip),
                                 token_loss)
    return token_loss


def clip_masks(ratio, advantages, completion_mask, *, clip_low=0.2, clip_high=0.28):
    """The tokens whose ratio the clipped surrogate holds (DESIGN.md section 4), where the loss's
    gradient is 0: (low, high) bool [B, T], low = valid & A < 0 & ratio < 1 - clip_low,
    high = valid & A > 0 & ratio > 1 + clip_high.

    ratio, completion_mask [B, T]; advantages [B, T] or [B, 1]. policy_loss's clip_frac_low and
    clip_frac_high are their shares of the valid tokens.
    """
    valid = completion_mask.bool()
    return (valid & (advantages < 0) & (ratio < 1.0 - clip_low),
            valid & (advantages > 0) & (ratio > 1.0 + clip_high))


def policy_loss(logprobs, old_logprobs, advantages, completion_mask, *, clip_low=0.2,
                clip_high=0.28, dual_clip=None, ref_logprobs=None, kl_coef=0.0, kl_clamp=20.0,
                kl_mask=None, loss_agg="token-mean", norm_constant=None):
    """clipped_token_loss + kl_coef * k3, aggregated ->
    (loss scalar, stats dict of detached 0-dim tensors).

    logprobs      [B, T] log-probs of the sampled tokens under the current policy
                  (carries the gradient)
    old_logprobs  [B, T] the same under the policy that sampled them (detached)
    advantages    [B] (one per completion, broadcast over tokens) or [B, T]
                  (token-level, e.g. after AR)
    completion_mask [B, T] bool/0-1: valid completion tokens; it alone sets the loss denominator
    dual_clip     c > 1: for A < 0 the per-token loss is capped at -A * c (None = off)
    ref_logprobs  [B, T] reference-policy log-probs; adds kl_coef * k3 on the tokens of kl_mask
                  (kl_clamp: k3's log-ratio clamp, see kl_k3)
    kl_mask       [B, T] tokens that carry the KL term
                  (default completion_mask; Lopti passes its pass mask)
    loss_agg      one of LOSS_AGGS; norm_constant for seq-mean-token-sum-norm (default T)
    stats (tensors, so a trainer can sum them on the device and read them once per step):
    clip_frac_low (A < 0 and ratio < 1 - clip_low),
    clip_frac_high (A > 0 and ratio > 1 + clip_high), ratio_mean, ratio_max, pg_loss;
    dual_clip_frac only with dual_clip, kl (mean k3 over kl_mask) only with a reference.
    Fractions and means are over the valid tokens. A loss near 0 is normal on the first minibatch
    (see the module docstring).
    """
    if (logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape
            or completion_mask.shape != logprobs.shape):
        raise ValueError(f"logprobs, old_logprobs, completion_mask must share shape [B, T]; got "
                         f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, "
                         f"{tuple(completion_mask.shape)}")
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    if advantages.dim() != 2 or advantages.shape[0] != logprobs.shape[0] or \
            advantages.shape[1] not in (1, logprobs.shape[1]):
        raise ValueError(f"advantages must have shape [B] or [B, T] = {tuple(logprobs.shape)}, "
                         f"got {tuple(advantages.shape)}")
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; choose from {', '.join(LOSS_AGGS)}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip!r}")
    mask = completion_mask.bool()
    advantages = advantages.to(logprobs.dtype)

    token_loss = clipped_token_loss(logprobs, old_logprobs, advantages, clip_low=clip_low,
                                    clip_high=clip_high, dual_clip=dual_clip)
    # where, not *, so garbage at padding cannot leak NaN
    token_loss = torch.where(mask, token_loss, 0.0)
    pg_loss = aggregate(token_loss, mask, loss_agg, norm_constant)
    loss = pg_loss
    stats = {}
    if ref_logprobs is not None:
        kl_mask = mask if kl_mask is None else kl_mask.bool()
        k3 = torch.where(kl_mask, kl_k3(logprobs, ref_logprobs, kl_clamp), 0.0)
        # denominator: full completion_mask
        loss = loss + kl_coef * aggregate(k3, mask, loss_agg, norm_constant)
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


class StepStats:
    """Sums policy_loss's stats over a step's micro-batches on the device, weighted by each
    micro-batch's share of its mini-batch, and reads them once (no sync per micro-batch).
    ratio_max is a max, grad_norm the mean over optimizer steps; loss and entropy (the token-mean
    entropy of the micro-batch) are added to the stats."""
    def __init__(self):
        self.sums, self.weight, self.grad_norms = {}, 0.0, []

    def add(self, loss_stats, loss, entropy, mask, *, weight):
        loss_stats = {**loss_stats, "loss": loss.detach(),
                      "entropy": (entropy * mask).sum() / mask.sum().clamp_min(1)}
        for key, value in loss_stats.items():
            self.sums[key] = (torch.maximum(self.sums.get(key, value), value) if key == "ratio_max"
                              else self.sums.get(key, 0.0) + value * weight)
        self.weight = self.weight + weight

    def result(self):
        """-> python floats: each stat's weighted mean (ratio_max: max), grad_norm,
        optimizer_steps."""
        out = {key: (value if key == "ratio_max" else value / self.weight).item()
               for key, value in self.sums.items()}
        if self.grad_norms:
            out["grad_norm"] = torch.stack(self.grad_norms).mean().item()
        return {**out, "optimizer_steps": len(self.grad_norms)}
