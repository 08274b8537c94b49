"""Group advantages for RL on LLMs, and the exact binary-reward theory of SoftmaxGRPO.

SoftmaxGRPO (Hernandez et al., arXiv 2608.09271) replaces GRPO's z-score advantage with

    A_i = M * softmax(R / tau)_i - 1          R: [G, M] rewards, G prompts x M completions

A trainer calls `advantages = group_advantages(rewards, "softmax", tau=0.1)` once per step and
gives each completion's advantage to all of its tokens. The rest is the theory for binary rewards
(Eq. (4)): the weight omega_{M,tau}(p) on grad p, its integral h, MaxRL's and GRPO's weights, a rule
for tau (DESIGN.md sections 2-3).
"""
import math

import numpy as np
import torch


# estimators (torch): rewards R [G, M] -> advantages [G, M]

def softmax_advantages(rewards, tau):
    """A_i = M * softmax(R / tau)_i - 1 per group (the paper's Eq. (2)): rewards [G, M] -> [G, M]
    float32.

    A sums to 0 over each group, and is exactly 0 for a group of equal rewards (a group of one
    included); a constant, as the paper's code (no gradient through the rewards). Copy this function
    alone. Why: the group's best completions share the push, more sharply the smaller tau (tau -> 0:
    MaxRL).
    """
    R = torch.as_tensor(rewards).detach().double()
    if not (R.dim() == 2 and R.shape[1] >= 1 and torch.isfinite(R).all()
            and 0 < float(tau) < math.inf):
        raise ValueError(f"need finite rewards [G, M], M >= 1, and a finite tau > 0, got "
                         f"{tuple(R.shape)}, {tau!r}")
    weights = torch.softmax((R - R.amax(1, keepdim=True)) / tau, dim=1)  # exp(<= 0) <= 1
    advantages = R.shape[1] * weights - 1.0
    return torch.where(R.amax(1, keepdim=True) == R.amin(1, keepdim=True), 0.0, advantages).float()


def _reinforce_pp(R, tokens, **_):  # REINFORCE++ as verl whitens it: R on each token, batch-wide
    mean = (tokens * R).sum() / tokens.sum()
    variance = (tokens * (R - mean) ** 2).sum() / (tokens.sum() - 1)
    return (R - mean) / torch.sqrt(variance + 1e-8)


ESTIMATORS = {  # R is float64 for softmax, float32 for the others
    "softmax": lambda R, tau, **_: softmax_advantages(R, tau),
    "grpo": lambda R, eps, **_: (R - R.mean(1, keepdim=True)) / (R.std(1, keepdim=True) + eps),
    "dr_grpo": lambda R, **_: R - R.mean(1, keepdim=True),
    "rloo": lambda R, **_: R - (R.sum(1, keepdim=True) - R) / (R.shape[1] - 1),  # minus the others
    "maxrl": lambda R, **_: R.double() / R.double().mean(1, keepdim=True).clamp_min(1e-300) - 1.0,
    "reinforce": lambda R, **_: R - R.mean(),
    "reinforce_pp": _reinforce_pp,
}
METHODS = tuple(ESTIMATORS)
BATCH_BASELINES = ("reinforce", "reinforce_pp")  # a baseline of the whole batch, not of each group


def group_advantages(rewards, method, *, tau=0.1, eps=1e-6, lengths=None):
    """A = ESTIMATORS[method](R), and exactly 0 for a group whose rewards are all equal (no signal).

    rewards [G, M] -> [G, M] float32, a constant (no gradient through the rewards); a group of one
    gets 0 from every per-group method; lengths [G, M] (token counts) is read by reinforce_pp only,
    None: 1 each. Why a table: each method is a baseline and a scale, so they differ in one line
    (DESIGN.md section 2).
    """
    R, tokens = _check_rewards(rewards, method, tau, lengths)
    if R.shape[1] == 1 and method not in BATCH_BASELINES:  # a group of one: no baseline, no signal
        return torch.zeros_like(R, dtype=torch.float32)
    advantages = ESTIMATORS[method](R, tau=tau, eps=eps, tokens=tokens)
    no_signal = (R.amax() == R.amin() if method in BATCH_BASELINES
                 else R.amax(dim=1, keepdim=True) == R.amin(dim=1, keepdim=True))
    return torch.where(no_signal, 0.0, advantages).float()


def _check_rewards(rewards, method, tau, lengths):
    """(R, tokens) for group_advantages, or ValueError at the first bad input."""
    R = torch.as_tensor(rewards).detach()
    R = R.to(torch.float64 if method == "softmax" else torch.float32)
    tokens = None if method != "reinforce_pp" else (
        torch.ones_like(R) if lengths is None else torch.as_tensor(lengths, dtype=torch.float32))
    if method not in METHODS:
        raise ValueError(f"unknown advantage method {method!r}; choose from {', '.join(METHODS)}")
    if R.dim() != 2 or R.shape[1] < 1 or (len(R) < 1 and method != "softmax") or \
            (R.shape[1] < 2 and method in BATCH_BASELINES):
        raise ValueError(f"rewards must have shape [G, M] with G >= 1 and M >= 1 (M >= 2 for a "
                         f"batch baseline), got {tuple(R.shape)}")
    if not torch.isfinite(R).all():
        raise ValueError("rewards contain NaN or inf")
    if method == "softmax" and not (math.isfinite(float(tau)) and float(tau) > 0):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    if method == "maxrl" and (R < 0).any():
        raise ValueError("maxrl needs rewards >= 0 (it divides by the group mean); use softmax or "
                         "grpo")
    if method == "reinforce_pp" and (tokens.shape != R.shape or (tokens < 0).any()
                                     or tokens.sum() < 2):
        raise ValueError(f"lengths must be [G, M] = {tuple(R.shape)} non-negative counts, >= 2 in "
                         f"all")
    return R, tokens


# exact binary-reward theory (numpy, float64): p is a float or an array, the output of its shape

def prompt_weight(p, M, tau):
    """omega_{M,tau}(p) = sum_{s=0}^{M-1} C(M-1, s) p^s (1-p)^(M-1-s) Delta_s (Eq. (4), a Bernstein
    polynomial).

    Why: the expected SoftmaxGRPO update of a prompt with pass rate p is omega * grad p. tau = 0:
    MaxRL's weight.
    """
    p_array, M, tau = _check_theory(p, M, tau)
    return _as_output(_binomial_pmf(p_array, M - 1) @ _softmax_delta(M, tau), p)


def prompt_objective(p, M, tau):
    """h_{M,tau}(p) = integral_0^p omega = (1/M) sum_s Delta_s P(Binomial(M, p) > s), so h(0) = 0.

    Why: it is the objective SoftmaxGRPO climbs, as d/dp P(Bin(M, p) > s)
    = M C(M-1, s) p^s (1-p)^(M-1-s).
    """
    p_array, M, tau = _check_theory(p, M, tau)
    pmf = _binomial_pmf(p_array, M)                             # [..., M+1], j = 0..M
    tail = np.cumsum(pmf[..., ::-1], axis=-1)[..., ::-1]        # tail[j] = P(Bin >= j)
    return _as_output(tail[..., 1:] @ _softmax_delta(M, tau) / M, p)  # P(Bin > s) = tail[s+1]


def maxrl_weight(p, M):
    """(1 - (1-p)^(M-1)) / p, MaxRL's prompt weight (= omega_{M,0}), and M - 1 at p = 0."""
    p_array, M, _ = _check_theory(p, M)
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = -np.expm1((M - 1) * np.log1p(-p_array)) / p_array
    return _as_output(np.where(p_array == 0, M - 1.0, weight), p)


def grpo_prompt_weight(p, M, *, eps=1e-6):
    """sum_S C(M-1, S) p^S (1-p)^(M-1-S) (A_succ(S+1) - A_fail(S)): GRPO's weight by Eq. (4)'s
    argument.

    With k successes, std = sqrt(k (M-k) / (M (M-1))) (unbiased), A_succ(k) = (1 - k/M) /
    (std + eps) and A_fail(k) = -(k/M) / (std + eps), both 0 for k = 0 or M. Why: it grows like
    1/sqrt(p (1-p)) (Fig. 1).
    """
    p_array, M, _ = _check_theory(p, M)
    k = np.arange(M + 1, dtype=np.float64)
    std = np.sqrt(k * (M - k) / (M * (M - 1)))
    all_equal = (k == 0) | (k == M)
    A_succ = np.where(all_equal, 0.0, (1 - k / M) / (std + eps))
    A_fail = np.where(all_equal, 0.0, -(k / M) / (std + eps))
    delta = A_succ[1:] - A_fail[:-1]                             # S = 0..M-1
    return _as_output(_binomial_pmf(p_array, M - 1) @ delta, p)


def adaptive_tau(successes, M, target_ess):
    """tau = 1 / ln c, c = 1 + (k (M-m) + sqrt(k (M-k) m (M-m))) / (k (m-k)), k = successes,
    m = target_ess.

    Why: then the softmax weights of a binary group have
    ESS = (k c + M - k)^2 / (k c^2 + M - k) = m. Python numbers in; None for k = 0 or M, 0.0
    (MaxRL) for m <= k, math.inf for m >= M (DESIGN.md section 3).
    """
    _check_theory(M=M, successes=successes, target_ess=target_ess)
    k, m = int(successes), float(target_ess)
    if k == 0 or k == M:
        return None
    if m <= k:
        return 0.0
    if m >= M:
        return math.inf
    c_minus_1 = (k * (M - m) + math.sqrt(k * (M - k) * m * (M - m))) / (k * (m - k))
    return 1.0 / math.log1p(c_minus_1)


def _check_theory(p=0.0, M=2, tau=0.0, successes=0, target_ess=0.0):
    """(p as a float64 array, M as int, tau as float), or ValueError at the first bad input."""
    try:
        tau_value = float(tau)
    except (TypeError, ValueError):
        tau_value = math.nan
    p_array = np.asarray(p, dtype=np.float64)
    if int(M) != M or M < 2:
        raise ValueError(f"group size M must be an integer >= 2, got M={M}")
    if not np.all((p_array >= 0) & (p_array <= 1)):
        raise ValueError("pass probability p must lie in [0, 1]")
    if not math.isfinite(tau_value) or tau_value < 0:
        raise ValueError(f"tau must be a finite number >= 0, got {tau!r}")
    if int(successes) != successes or not 0 <= successes <= M:
        raise ValueError(f"need an integer 0 <= successes <= M, got successes={successes}, M={M}")
    if not math.isfinite(target_ess):
        raise ValueError(f"target_ess must be finite, got {target_ess!r}")
    return p_array, int(M), tau_value


def _binomial_pmf(p, n):
    """C(n, s) p^s (1-p)^(n-s) for s = 0..n, [..., n+1], in log space."""
    s = np.arange(n + 1, dtype=np.float64)
    p = p[..., None]
    log_choose = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                           for k in range(n + 1)])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = np.where(s == 0, 0.0, s * np.log(p))  # 0 * log 0 = 0
        log_q = np.where(s == n, 0.0, (n - s) * np.log1p(-p))
    return np.exp(log_choose + log_p + log_q)


def _softmax_delta(M, tau):
    """Delta_S = M (w_succ(S) - w_fail(S)) for S = 0..M-1 other successes, written with
    r = exp(-1/tau)."""
    r = 0.0 if tau == 0 else math.exp(-1.0 / tau)
    S = np.arange(M, dtype=np.float64)
    w_succ = 1.0 / ((S + 1) + (M - 1 - S) * r)
    w_fail = np.empty(M)
    w_fail[0] = 1.0 / M                                          # S = 0: every completion failed
    w_fail[1:] = r / (S[1:] + (M - S[1:]) * r)
    return M * (w_succ - w_fail)


def _as_output(value, p):
    """A Python float for a scalar p, else the array."""
    return float(value) if np.ndim(p) == 0 else value
