"""Advantage Reweighting (AR) and Low-Probability Token Isolation (Lopti), Yang et al.
arXiv 2505.12929.

A token's logit gradient has a norm in [1, sqrt 2] x (1 - p_o) (Prop. 4.2): rare tokens dominate
an update.

    AR     A'_{i,t} = (alpha * p_old_{i,t} + 1 - alpha) * A_i    p_old = exp(old_logprobs), detached
    Lopti  update on the valid tokens with p_old < eta first, then on the others

A trainer's step with both, as written: train.update_policy (DESIGN.md section 1).
"""
import math

import torch

PASS_ORDERS = ("low-first", "high-first")


def reweight_advantages(advantages, old_token_probs, completion_mask, alpha):
    """A'_{i,t} = (alpha * p_old_{i,t} + 1 - alpha) * A_i (the paper's AR equation), damping the
    rare tokens.

    advantages [B] or [B, T]; old_token_probs (None at alpha = 0) and completion_mask [B, T]
    -> [B, T] float32.
    """
    _check_inputs(old_token_probs, completion_mask, alpha=alpha, advantages=advantages)
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    if alpha == 0:
        return advantages.float() * completion_mask.float()
    scale = alpha * old_token_probs.float() + (1.0 - alpha)
    return torch.where(completion_mask.bool(), scale * advantages.float(), 0.0)


def isolation_masks(old_token_probs, completion_mask, eta):
    """low = valid & (p_old < eta), high = valid & ~low: Lopti's split of the valid tokens, bool
    [B, T] each."""
    _check_inputs(old_token_probs, completion_mask)
    valid = completion_mask.bool()
    low_mask = valid & (old_token_probs < eta)
    return low_mask, valid & ~low_mask


def lopti_passes(token_advantages, old_token_probs, completion_mask, eta, order="low-first"):
    """[(name, A zeroed off pass_mask, pass_mask)]: the low tokens first, then the high (the Lopti
    algorithm).

    token_advantages [B, T]; eta <= 0 turns Lopti off: [("all", token_advantages, completion_mask)].
    Why low first: the other order ("high-first") destabilised training in the paper's ablation.
    """
    _check_inputs(eta=eta, order=order, token_advantages=token_advantages)
    if eta <= 0:
        return [("all", token_advantages, completion_mask)]
    low_mask, high_mask = isolation_masks(old_token_probs, completion_mask, eta)
    passes = [("low", low_mask), ("high", high_mask)]
    if order == "high-first":
        passes.reverse()
    return [(name, torch.where(mask, token_advantages, 0.0), mask) for name, mask in passes]


def logit_grad_norm_bounds(token_prob, vocab_size):
    """(sqrt(N/(N-1)) (1 - p), sqrt(2) (1 - p)) bound ||onehot(o) - softmax(z)||, p = pi_o
    (Prop. 4.2)."""
    _check_inputs(vocab_size=vocab_size)
    return (math.sqrt(vocab_size / (vocab_size - 1)) * (1 - token_prob),
            math.sqrt(2.0) * (1 - token_prob))


def _check_inputs(probs=None, mask=None, *, alpha=0.0, advantages=None, eta=0.0, order="low-first",
                  token_advantages=None, vocab_size=2):
    """ValueError at the first bad input of the functions above (each passes the inputs it
    takes)."""
    shape = lambda x: None if x is None else tuple(x.shape)  # noqa: E731
    B, T = shape(mask) if mask is not None and mask.dim() == 2 else (None, None)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if probs is None and alpha != 0:
        raise ValueError(f"AR with alpha {alpha!r} reads p_old: old_token_probs must be given")
    if probs is not None and probs.shape != mask.shape:
        raise ValueError(f"old_token_probs {shape(probs)} and completion_mask {shape(mask)} must "
                         f"have the same shape")
    if advantages is not None and (B is None or advantages.shape[0] != B
                                   or advantages.dim() > 1 and advantages.shape[1] not in (1, T)):
        raise ValueError(f"advantages must be [B] or [B, T] and completion_mask [B, T], got "
                         f"{shape(advantages)} and {shape(mask)}")
    if order not in PASS_ORDERS:
        raise ValueError(f"unknown Lopti order {order!r}; choose from {', '.join(PASS_ORDERS)}")
    if not math.isfinite(eta):
        raise ValueError(f"eta must be finite, got {eta!r}")
    if eta > 0 and token_advantages.dim() != 2:
        raise ValueError(f"token_advantages must be [B, T] (use reweight_advantages first), got "
                         f"{shape(token_advantages)}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
