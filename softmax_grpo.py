"""Group advantages for RL on LLMs, and the exact binary-reward theory of SoftmaxGRPO.

SoftmaxGRPO (Hernandez et al., arXiv 2608.09271) replaces GRPO's z-score advantage with

    A_i = M * softmax(R / tau)_i - 1          R: [G, M] rewards, G prompts x M completions

Everything a trainer needs is `group_advantages(rewards, method)`; the rest of this file is the
theory for binary rewards (Eq. (4)): the per-prompt weight omega_{M,tau}(p) that multiplies grad p
in the expected update, its integral h_{M,tau}(p), the MaxRL and GRPO weights for comparison, and an
effective-sample-size rule for choosing tau. Formulas: DESIGN.md sections 2-3.
"""
import math

import numpy as np
import torch

METHODS = ("softmax", "grpo", "dr_grpo", "rloo", "maxrl", "reinforce", "reinforce_pp")


# --------------------------------------------------------------------------------------------------
# estimators (torch): rewards [G, M] -> advantages [G, M] float32

def softmax_advantages(rewards, tau):
    """SoftmaxGRPO advantages A_i = M * softmax(R / tau)_i - 1, per group (the paper's Eq. (2)).

    rewards: [G, M] float tensor (any float dtype), M >= 2, finite. Returns [G, M] float32, summing
    to 0 over each group; a group whose rewards are all equal gets exactly 0.
    Self-contained: copy this function alone.
    Computed in float64 as softmax((R - max R) / tau): tau = 1e-6 with rewards ~1e3 never overflows,
    and tau = 1e8 still gives A ~ (R - mean) / tau instead of float32's exact 1.0 weights
    (A = 0, no update).
    Limits: tau -> 0 is MaxRL (binary: M/K - 1 for the K successes, -1 for failures);
    tau -> inf, (R - mean) / tau.
    """
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must have shape [G, M] with M >= 2, got {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    if not (math.isfinite(float(tau)) and float(tau) > 0):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    rewards = rewards.double()
    M = rewards.shape[1]
    # <= 0, so exp() <= 1: no overflow
    shifted = (rewards - rewards.amax(dim=1, keepdim=True)) / tau
    advantages = M * torch.softmax(shifted, dim=1) - 1.0
    # no signal: exactly 0
    all_equal = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(all_equal, 0.0, advantages).float()


def group_advantages(rewards, method, *, tau=0.1, eps=1e-6, lengths=None):
    """Advantages for G groups of M completions: rewards [G, M] -> [G, M] float32
    (DESIGN.md section 2).

    method:
      softmax       M * softmax(R/tau) - 1                       SoftmaxGRPO
      grpo          (R - mean) / (std + eps), unbiased std         DeepSeekMath GRPO
      dr_grpo       R - mean                                       Dr. GRPO (no std)
      rloo          R_i - mean of the other M-1 rewards            leave-one-out
      maxrl         R / mean - 1  (needs R >= 0; 0 if all fail)    MaxRL
      reinforce     R - mean over the whole batch [G, M]           plain baseline
      reinforce_pp  (R - m) / sqrt(v + 1e-8), m and unbiased v over  REINFORCE++ as verl computes it: each
                    all completion tokens of the batch                completion's reward on each of its tokens,
                                                                      whitened over the batch's valid tokens
    Group methods give exactly 0 for a group whose rewards are all equal. lengths [G, M]: completion
    token counts, read by reinforce_pp only (None: one token each, i.e. a z-score over completions).
    """
    if method not in METHODS:
        raise ValueError(f"unknown advantage method {method!r}; choose from {', '.join(METHODS)}")
    if method == "softmax":
        return softmax_advantages(rewards, tau)
    rewards = _check_rewards(rewards)
    M = rewards.shape[1]
    mean = rewards.mean(dim=1, keepdim=True)
    if method == "grpo":
        advantages = (rewards - mean) / (rewards.std(dim=1, keepdim=True, unbiased=True) + eps)
    elif method == "dr_grpo":
        advantages = rewards - mean
    elif method == "rloo":
        # R_i - (sum - R_i) / (M - 1)  ==  M / (M - 1) * (R_i - mean)
        advantages = rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (M - 1)
    elif method == "maxrl":
        if (rewards < 0).any():
            raise ValueError("maxrl needs rewards >= 0 (it divides by the group mean); "
                             "use softmax or grpo")
        # With R >= 0 and mean > 0, R / mean <= M, so no eps is needed;
        # all-fail groups are set to 0 below.
        # float64: a float32 mean can underflow to a subnormal (rewards 0 and 1e-38),
        # which no clamp divides right
        advantages = (
            rewards.double() / rewards.double().mean(dim=1, keepdim=True).clamp_min(1e-300) - 1.0
        ).float()
    elif method == "reinforce":
        advantages = rewards - rewards.mean()
        return torch.where(rewards.amax() == rewards.amin(), 0.0, advantages)
    else:
        # reinforce_pp: verl's masked_whiten of the token-level returns, with returns = R on every
        # valid token
        tokens = (torch.ones_like(rewards) if lengths is None
                  else torch.as_tensor(lengths, dtype=torch.float32))
        if tokens.shape != rewards.shape or (tokens < 0).any() or tokens.sum() < 2:
            raise ValueError(f"lengths must be [G, M] = {tuple(rewards.shape)} non-negative "
                             "counts, >= 2 in all")
        mean = (tokens * rewards).sum() / tokens.sum()
        # unbiased, as verl's masked_var
        variance = (tokens * (rewards - mean) ** 2).sum() / (tokens.sum() - 1)
        advantages = (rewards - mean) / torch.sqrt(variance + 1e-8)
        return torch.where(rewards.amax() == rewards.amin(), 0.0, advantages)
    return torch.where(_all_equal(rewards), 0.0, advantages)


# validation helpers of the estimators

def _check_rewards(rewards):
    """Validate a [G, M] rewards tensor and return it as float32
    (bf16/fp16/fp64 in, float32 out)."""
    if not torch.is_tensor(rewards):
        rewards = torch.as_tensor(rewards)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [G, M] (G prompts x M completions), "
                         f"got {tuple(rewards.shape)}")
    G, M = rewards.shape
    if M < 2:
        raise ValueError(f"group size M must be >= 2 (a single completion has no baseline), "
                         f"got M={M}")
    if G < 1:
        raise ValueError("rewards has no groups (G=0)")
    rewards = rewards.float()
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    return rewards


def _all_equal(rewards):
    """[G, 1] bool: groups whose rewards are all equal carry no signal; their advantages are
    exactly 0."""
    return (rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True))


# --------------------------------------------------------------------------------------------------
# exact binary-reward theory (numpy, float64; p may be a float or an array of any shape)

def prompt_weight(p, M, tau):
    """omega_{M,tau}(p), Eq. (4): the expected SoftmaxGRPO update of a prompt with pass rate p is
    omega * grad p.

    omega(p) = sum_{s=0}^{M-1} C(M-1, s) p^s (1-p)^(M-1-s) Delta_s
               (Bernstein polynomial of degree M-1)
    p: float or array in [0, 1]; returns the same shape.
    tau = 0 gives the MaxRL limit (1-(1-p)^(M-1))/p.
    """
    p_array, M = _check_p_M(p, M)
    omega = _binomial_pmf(p_array, M - 1) @ _softmax_delta(M, tau)
    return _as_output(omega, p)


def prompt_objective(p, M, tau):
    """h_{M,tau}(p) = integral_0^p omega: the per-prompt objective whose p-derivative is Eq. (4)'s
    weight.

    h(p) = (1/M) sum_s Delta_s P(Binomial(M, p) > s),
    using d/dp P(Bin(M,p) > s) = M C(M-1,s) p^s (1-p)^(M-1-s).
    p: float or array in [0, 1]; returns the same shape; h(0) = 0.
    """
    p_array, M = _check_p_M(p, M)
    pmf = _binomial_pmf(p_array, M)                             # [..., M+1], j = 0..M
    tail = np.cumsum(pmf[..., ::-1], axis=-1)[..., ::-1]        # tail[j] = P(Bin >= j)
    h = tail[..., 1:] @ _softmax_delta(M, tau) / M              # P(Bin > s) = tail[s+1], s = 0..M-1
    return _as_output(h, p)


def maxrl_weight(p, M):
    """MaxRL's prompt weight (1 - (1-p)^(M-1)) / p (= omega_{M,0}); its p -> 0 limit is M - 1.

    p: float or array in [0, 1]; M: int >= 2; returns p's shape.
    """
    p_array, M = _check_p_M(p, M)
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = -np.expm1((M - 1) * np.log1p(-p_array)) / p_array
    return _as_output(np.where(p_array == 0, M - 1.0, weight), p)


def grpo_prompt_weight(p, M, *, eps=1e-6):
    """GRPO's prompt weight by Eq. (4)'s conditioning argument, with z-score advantages
    (unbiased std + eps).

    A group with k successes has mean k/M, unbiased std sqrt(k (M-k) / (M (M-1))), so
    A_succ(k) = (1 - k/M) / (std + eps), A_fail(k) = -(k/M) / (std + eps), and A = 0 for k = 0
    or k = M.
    Delta_S = A_succ(S+1) - A_fail(S);  weight(p) = sum_S C(M-1,S) p^S (1-p)^(M-1-S) Delta_S.
    Large M: ~ 1/sqrt(p (1-p)), blowing up as p -> 1 (Fig. 1).
    p: float or array; returns the same shape.
    """
    p_array, M = _check_p_M(p, M)
    k = np.arange(M + 1, dtype=np.float64)
    std = np.sqrt(k * (M - k) / (M * (M - 1)))
    all_equal = (k == 0) | (k == M)
    A_succ = np.where(all_equal, 0.0, (1 - k / M) / (std + eps))
    A_fail = np.where(all_equal, 0.0, -(k / M) / (std + eps))
    delta = A_succ[1:] - A_fail[:-1]                             # S = 0..M-1
    return _as_output(_binomial_pmf(p_array, M - 1) @ delta, p)


def adaptive_tau(successes, M, target_ess):
    """Temperature at which a binary group with k = successes wins out of M has softmax
    ESS = target_ess.

    ESS = (k c + M - k)^2 / (k c^2 + M - k) with c = exp(1/tau) falls from M (tau = inf) to k
    (tau -> 0).
    Setting ESS = m gives k(k-m) c^2 + 2k(M-k) c + (M-k)(M-k-m) = 0, whose root above 1 is
    c = 1 + (k (M-m) + sqrt(k (M-k) m (M-m))) / (k (m-k)),  tau = 1 / ln c
    (DESIGN.md section 3; our derivation).
    successes, M: Python ints (one group, not a tensor); target_ess: float. Returns a float tau,
    None for k = 0 or k = M (weights uniform for every tau), 0.0 when m <= k (the MaxRL limit),
    math.inf when m >= M (uniform weights).
    """
    if int(successes) != successes or int(M) != M or not 0 <= successes <= M or M < 2:
        raise ValueError(f"need integers 0 <= successes <= M and M >= 2, "
                         f"got successes={successes}, M={M}")
    if not math.isfinite(target_ess):
        raise ValueError(f"target_ess must be finite, got {target_ess!r}")
    k, m = int(successes), float(target_ess)
    if k == 0 or k == M:
        return None
    if m <= k:
        return 0.0
    if m >= M:
        return math.inf
    c_minus_1 = (k * (M - m) + math.sqrt(k * (M - k) * m * (M - m))) / (k * (m - k))
    return 1.0 / math.log1p(c_minus_1)


# helpers of the theory

def _check_p_M(p, M):
    """(p as a float64 array of p's shape, M as int); ValueError unless p lies in [0, 1] and M is
    an integer >= 2."""
    if int(M) != M or M < 2:
        raise ValueError(f"group size M must be an integer >= 2, got M={M}")
    p_array = np.asarray(p, dtype=np.float64)
    if not np.all((p_array >= 0) & (p_array <= 1)):
        raise ValueError("pass probability p must lie in [0, 1]")
    return p_array, int(M)


def _check_tau(tau, allow_zero=False):
    """tau as a Python float; ValueError unless it is finite and > 0
    (>= 0 with allow_zero, the MaxRL limit)."""
    try:
        tau = float(tau)
    except (TypeError, ValueError):
        raise ValueError(f"tau must be a number, got {tau!r}") from None
    if not math.isfinite(tau) or tau < 0 or (tau == 0 and not allow_zero):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    return tau


def _binomial_pmf(p, n):
    """[..., n+1] array of C(n, s) p^s (1-p)^(n-s), computed in log space
    (no overflow for large n)."""
    s = np.arange(n + 1, dtype=np.float64)
    p = p[..., None]
    log_choose = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                           for k in range(n + 1)])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = np.where(s == 0, 0.0, s * np.log(p))  # 0 * log 0 = 0
        log_q = np.where(s == n, 0.0, (n - s) * np.log1p(-p))
    return np.exp(log_choose + log_p + log_q)


def _softmax_delta(M, tau):
    """Delta_S = M (w_succ(S) - w_fail(S)) for S = 0..M-1 other successes, [M] array
    (DESIGN.md section 3).

    Written with r = exp(-1/tau) = 1/c:  w_succ = 1 / ((S+1) + (M-1-S) r),
    w_fail = r / (S + (M-S) r), so r underflowing to 0 (tiny tau, or tau = 0) is harmless.
    S = 0: every completion failed -> w_fail = 1/M.
    """
    tau = _check_tau(tau, allow_zero=True)  # tau = 0 is the MaxRL limit
    r = 0.0 if tau == 0 else math.exp(-1.0 / tau)
    S = np.arange(M, dtype=np.float64)
    w_succ = 1.0 / ((S + 1) + (M - 1 - S) * r)
    w_fail = np.empty(M)
    w_fail[0] = 1.0 / M
    w_fail[1:] = r / (S[1:] + (M - S[1:]) * r)
    return M * (w_succ - w_fail)


def _as_output(value, p):
    """A Python float when the caller's p was a scalar, else the array (p's shape) as it is."""
    return float(value) if np.ndim(p) == 0 else value
