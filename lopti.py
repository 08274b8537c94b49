"""Advantage Reweighting (AR) and Low-Probability Token Isolation (Lopti), Yang et al. 2505.12929.

Why: the gradient of a token's log-prob with respect to the logits is onehot(o) - softmax(z), whose
norm is at least sqrt(N/(N-1)) (1 - pi_o) and at most sqrt(2) (1 - pi_o) (Prop. 4.2).
Low-probability tokens therefore dominate the update and can push high-probability tokens the wrong
way. Two fixes:

  AR     scale each token's advantage by alpha * p_old + (1 - alpha)       (the paper's AR equation)
  Lopti  split the valid tokens by p_old < eta and update twice: low-probability tokens first,
         then the high-probability ones (the paper's Lopti algorithm)

How a trainer uses this file (one optimisation step; see train.py):

    # alpha = 0: identity
    token_adv = reweight_advantages(adv, old_token_probs, completion_mask, alpha)
    for name, pass_adv, pass_mask in lopti_passes(token_adv, old_token_probs, completion_mask, eta):
        # logprobs recomputed for each pass
        loss, stats = policy_loss(logprobs, old_logprobs, pass_adv, completion_mask,
                                  ref_logprobs=ref_logprobs, kl_coef=kl_coef, kl_mask=pass_mask)
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Both passes use the same old and reference log-probs (nothing is re-sampled or re-scored in
between), so in pass 2 the ratio is pi_after_pass1 / pi_old and clipping bounds the cumulative move.
The KL term is restricted to the pass's tokens, while the loss denominator stays the full
completion_mask. "old_token_probs" is exp(old_logprobs): the sampled token's probability under the
sampling policy, detached.
"""
import math

import torch

PASS_ORDERS = ("low-first", "high-first")


def reweight_advantages(advantages, old_token_probs, completion_mask, alpha):
    """Advantage Reweighting (Yang et al. 2505.12929, AR equation):
    A'_{i,t} = (alpha * p_old_{i,t} + 1 - alpha) A_i.

    advantages [B] or [B, T]; old_token_probs, completion_mask [B, T]. Returns [B, T] float32 token
    advantages, zero outside the mask. Applies to positive and negative advantages alike; alpha = 0
    is the identity, A times the mask, and reads no p_old (old_token_probs may be None: train.py's
    speed rule measures none).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if old_token_probs is None and alpha != 0:
        raise ValueError(f"AR with alpha {alpha!r} reads p_old: old_token_probs must be given")
    probs = completion_mask if old_token_probs is None else old_token_probs  # for the shape checks
    if probs.shape != completion_mask.shape or probs.dim() != 2:
        raise ValueError(f"old_token_probs and completion_mask must share shape [B, T], got "
                         f"{tuple(probs.shape)} and {tuple(completion_mask.shape)}")
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    if advantages.shape[0] != probs.shape[0] or advantages.shape[1] not in (1, probs.shape[1]):
        raise ValueError(f"advantages must have shape [B] or [B, T] = "
                         f"{tuple(probs.shape)}, got {tuple(advantages.shape)}")
    if alpha == 0:  # the identity
        return advantages.float() * completion_mask.float()
    scale = alpha * old_token_probs.float() + (1.0 - alpha)
    return torch.where(completion_mask.bool(), scale * advantages.float(), 0.0)


def isolation_masks(old_token_probs, completion_mask, eta):
    """Lopti's token split (Yang et al. 2505.12929, Lopti algorithm):
    low = valid & p_old < eta, high = the rest.

    old_token_probs, completion_mask [B, T]. Returns (low_mask, high_mask), bool [B, T], disjoint,
    and their union is exactly the valid tokens.
    """
    if old_token_probs.shape != completion_mask.shape:
        raise ValueError(f"old_token_probs {tuple(old_token_probs.shape)} and completion_mask "
                         f"{tuple(completion_mask.shape)} must have the same shape")
    valid = completion_mask.bool()
    low_mask = valid & (old_token_probs < eta)
    return low_mask, valid & ~low_mask


def lopti_passes(token_advantages, old_token_probs, completion_mask, eta, order="low-first"):
    """The update passes of one Lopti step: list of
    (name, pass_advantages [B, T], pass_mask bool [B, T]).

    eta <= 0 turns Lopti off: [("all", token_advantages, completion_mask)]. Otherwise two passes,
    low-probability tokens first ("low-first", essential per the paper's ablation) or "high-first"
    for that ablation; each pass's advantages are zeroed outside its mask. Both passes are always
    returned; an empty pass has zero gradient, but an optimizer with momentum or weight decay still
    moves the weights, so a trainer may skip it.
    """
    if order not in PASS_ORDERS:
        raise ValueError(f"unknown Lopti order {order!r}; choose from {', '.join(PASS_ORDERS)}")
    if not math.isfinite(eta):
        raise ValueError(f"eta must be finite, got {eta!r}")
    if eta <= 0:
        return [("all", token_advantages, completion_mask)]
    if token_advantages.dim() != 2:
        raise ValueError(f"token_advantages must be [B, T] (use reweight_advantages first), "
                         f"got {tuple(token_advantages.shape)}")
    low_mask, high_mask = isolation_masks(old_token_probs, completion_mask, eta)
    passes = [("low", low_mask), ("high", high_mask)]
    if order == "high-first":
        passes.reverse()
    return [(name, torch.where(mask, token_advantages, 0.0), mask) for name, mask in passes]


def logit_grad_norm_bounds(token_prob, vocab_size):
    """Prop. 4.2 of Yang et al. 2505.12929: bounds on
    ||d log pi_o / d z|| = ||onehot(o) - softmax(z)||.

    token_prob: pi_o (float or tensor); vocab_size N >= 2.
    Returns (sqrt(N/(N-1)) (1 - pi_o), sqrt(2) (1 - pi_o)).
    The lower bound is reached when the other N-1 tokens share 1 - pi_o equally, the upper when one
    token holds it.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return (math.sqrt(vocab_size / (vocab_size - 1)) * (1 - token_prob),
            math.sqrt(2.0) * (1 - token_prob))
