"""The exact binary-reward theory of SoftmaxGRPO (DESIGN.md section 3), proven rather than restated.

The prompt weight omega_{M,tau}(p) against an independent Bernstein sum and its limits;
Eq. (4) by Monte Carlo with autograd; the large-group limit grad log E[exp(R/tau)]; and the non-conservative
update field for three reward levels (exact enumeration of group outcomes).
"""
import itertools
import math

import numpy as np
import pytest
import torch

from softmax_grpo import (group_advantages, grpo_prompt_weight, maxrl_weight, prompt_objective,
                          prompt_weight)

P_GRID = np.array([0.0, 1e-4, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.999, 1.0])


# ---------------------------------------------------------------------------------------------------
# omega and h

def omega_direct(p, M, tau):
    """Bernstein sum written with c = e^{1/tau} exactly as DESIGN.md states it (fine for moderate tau)."""
    c = math.exp(1.0 / tau)
    total = 0.0
    for s in range(M):
        w_succ = c / ((s + 1) * c + M - 1 - s)
        w_fail = 1.0 / (s * c + M - s)
        total += math.comb(M - 1, s) * p ** s * (1 - p) ** (M - 1 - s) * M * (w_succ - w_fail)
    return total


@pytest.mark.parametrize("M", [2, 3, 8, 16])
@pytest.mark.parametrize("tau", [0.1, 0.3, 1.0, 5.0])
def test_omega_matches_independent_bernstein_sum(M, tau):
    expected = np.array([omega_direct(p, M, tau) for p in P_GRID])
    np.testing.assert_allclose(prompt_weight(P_GRID, M, tau), expected, rtol=1e-10, atol=1e-12)
    assert isinstance(prompt_weight(0.3, M, tau), float)


@pytest.mark.parametrize("tau", [0.0, 1e-8, 0.01, 0.1, 1.0, 100.0])
def test_omega_positive_and_finite_everywhere(tau):
    for M in (2, 8, 64, 1500):
        omega = prompt_weight(P_GRID, M, tau)
        assert np.all(np.isfinite(omega)) and np.all(omega > 0), (M, tau)


@pytest.mark.parametrize("M, tau", [(2, 0.1), (8, 0.1), (8, 1.0), (16, 0.3), (8, 0.0)])
def test_objective_derivative_is_omega(M, tau):
    p = np.linspace(0.01, 0.99, 25)
    step = 1e-5
    finite_difference = (prompt_objective(p + step, M, tau) - prompt_objective(p - step, M, tau)) / (2 * step)
    np.testing.assert_allclose(finite_difference, prompt_weight(p, M, tau), rtol=1e-6)
    assert prompt_objective(0.0, M, tau) == 0.0


def test_omega_small_tau_is_maxrl():
    for M in (2, 4, 8, 32):
        np.testing.assert_allclose(prompt_weight(P_GRID, M, 0.0), maxrl_weight(P_GRID, M), rtol=1e-12)
        np.testing.assert_allclose(prompt_weight(P_GRID, M, 0.02), maxrl_weight(P_GRID, M), rtol=1e-6)
        assert maxrl_weight(0.0, M) == M - 1
        # closed form of MaxRL (T = M - 1 terms of the geometric series 1 + (1-p) + ... )
        p = 0.3
        assert math.isclose(maxrl_weight(p, M), sum((1 - p) ** t for t in range(M - 1)), rel_tol=1e-12)


def test_omega_large_tau_is_uniform():
    for M in (2, 8, 16):
        np.testing.assert_allclose(1e5 * prompt_weight(P_GRID, M, 1e5), (M - 1) / M, rtol=1e-4)


def test_grpo_weight_large_group_is_inverse_std():
    # Large M: A_succ - A_fail -> 1/std = 1/sqrt(p(1-p)); it diverges at both ends, unlike SoftmaxGRPO.
    p = np.array([0.1, 0.3, 0.5, 0.9])
    np.testing.assert_allclose(grpo_prompt_weight(p, 2048) * np.sqrt(p * (1 - p)), 1.0, rtol=2e-2)
    assert grpo_prompt_weight(0.999, 2048) > 10 * grpo_prompt_weight(0.5, 2048)


# ---------------------------------------------------------------------------------------------------
# Eq. (4) by Monte Carlo: E[(1/M) sum_i A_i grad log pi(y_i)] = omega(p) grad p

def monte_carlo_update(p, M, method, tau, groups=40_000, seed=0):
    """Per-group unclipped update for a Bernoulli policy pi(y=1) = sigmoid(theta), via autograd.

    theta is replicated once per group ([groups, 1], same value) so one backward pass yields every group's
    gradient d/dtheta (1/M) sum_i A_i log pi(y_i); returns (mean, standard error) over groups.
    """
    generator = torch.Generator().manual_seed(seed)
    theta = torch.full((groups, 1), math.log(p / (1 - p)), dtype=torch.float64, requires_grad=True)
    y = torch.bernoulli(torch.full((groups, M), p, dtype=torch.float64), generator=generator)
    advantages = group_advantages(y, method, tau=tau).double()
    log_pi = y * torch.nn.functional.logsigmoid(theta) + (1 - y) * torch.nn.functional.logsigmoid(-theta)
    (advantages * log_pi).mean(dim=1).sum().backward()
    per_group = theta.grad[:, 0]
    return per_group.mean().item(), per_group.std().item() / math.sqrt(groups)


CASES = [(M, p) for M in (4, 8) for p in (0.1, 0.5, 0.95)]


@pytest.mark.parametrize("M, p", CASES)
@pytest.mark.parametrize("method, tau", [("softmax", 0.1), ("softmax", 0.5), ("grpo", 0.1), ("maxrl", 0.1)])
def test_eq4_monte_carlo(M, p, method, tau):
    weight = {"softmax": lambda: prompt_weight(p, M, tau), "grpo": lambda: grpo_prompt_weight(p, M),
              "maxrl": lambda: maxrl_weight(p, M)}[method]()
    expected = weight * p * (1 - p)                     # grad_theta p = p (1 - p)
    mean, standard_error = monte_carlo_update(p, M, method, tau, seed=M * 100 + int(p * 100))
    assert standard_error < 0.02 * expected              # so a 6% error in omega would fail
    assert abs(mean - expected) < 3 * standard_error, (mean, expected, standard_error)


def test_eq4_monte_carlo_categorical_policy():
    # Three tokens, tokens 1 and 2 both pass: Eq. (4) holds for the vector grad p = pi_j (1[j passes] - p).
    M, tau, groups = 6, 0.2, 40_000
    generator = torch.Generator().manual_seed(7)
    logits = torch.tensor([0.4, -0.3, -1.0], dtype=torch.float64)
    pi = torch.softmax(logits, 0)
    passes = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    p = (pi * passes).sum().item()
    theta = logits.repeat(groups, 1).requires_grad_(True)                      # [groups, 3]
    y = torch.multinomial(pi.expand(groups, 3), M, replacement=True, generator=generator)
    advantages = group_advantages(passes[y], "softmax", tau=tau).double()
    log_pi = torch.log_softmax(theta, dim=1).gather(1, y)
    (advantages * log_pi).mean(dim=1).sum().backward()
    mean = theta.grad.mean(0)
    standard_error = theta.grad.std(0) / math.sqrt(groups)
    expected = prompt_weight(p, M, tau) * pi * (passes - p)
    assert torch.all((mean - expected).abs() < 3 * standard_error), (mean, expected, standard_error)


# ---------------------------------------------------------------------------------------------------
# Large-group limit: the update is grad log E_pi[exp(R / tau)]

def test_large_group_limit_is_log_mgf_gradient():
    levels = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    logits = torch.tensor([0.8, 0.2, -0.9], dtype=torch.float64)
    M, groups, tau = 2048, 64, 0.25
    generator = torch.Generator().manual_seed(3)
    pi = torch.softmax(logits, 0)
    y = torch.multinomial(pi.expand(groups, 3), M, replacement=True, generator=generator)
    advantages = group_advantages(levels[y], "softmax", tau=tau).double()     # [groups, M]
    theta = logits.clone().requires_grad_(True)
    log_pi = torch.log_softmax(theta, 0)[y]
    ((advantages * log_pi).mean(dim=1).mean()).backward()
    update = theta.grad

    theta = logits.clone().requires_grad_(True)
    torch.log((torch.softmax(theta, 0) * torch.exp(levels / tau)).sum()).backward()
    target = theta.grad

    cosine = torch.dot(update, target) / (update.norm() * target.norm())
    assert cosine >= 0.99 and abs(update.norm() / target.norm() - 1) <= 0.05, (update, target)
    # The plain policy gradient grad E[R] points elsewhere, so the check has teeth.
    reinforce = pi * (levels - (pi * levels).sum())
    assert torch.dot(reinforce, target) / (reinforce.norm() * target.norm()) < 0.95


# ---------------------------------------------------------------------------------------------------
# Non-conservativeness: exact expected update field for three reward levels and small M

def expected_update(logits, levels, M, tau):
    """E[(1/M) sum_i A_i grad log pi(y_i)] for a 3-outcome categorical policy, by enumerating all counts."""
    counts = [c for c in itertools.product(range(M + 1), repeat=3) if sum(c) == M]
    outcome = torch.tensor([[k for k in range(3) for _ in range(c[k])] for c in counts])     # [C, M]
    advantages = group_advantages(torch.tensor(levels, dtype=torch.float64)[outcome], "softmax", tau=tau).double()
    counts = torch.tensor(counts, dtype=torch.float64)                                          # [C, 3]
    log_pi = torch.log_softmax(logits, 0)
    log_multinomial = math.lgamma(M + 1) - torch.lgamma(counts + 1).sum(1) + (counts * log_pi).sum(1)
    one_hot = torch.nn.functional.one_hot(outcome, 3).double()                                   # [C, M, 3]
    score = one_hot - torch.softmax(logits, 0)                                                   # grad log pi
    per_group = (advantages[:, :, None] * score).mean(dim=1)                                     # [C, 3]
    return (torch.exp(log_multinomial)[:, None] * per_group).sum(0)


@pytest.mark.parametrize("M", [2, 3, 4, 6])
def test_update_field_has_curl_for_three_levels_but_not_for_binary(M):
    logits = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    for levels, has_curl in [((0.0, 0.5, 1.0), True), ((0.0, 1.0, 1.0), False)]:
        jacobian = torch.autograd.functional.jacobian(lambda t: expected_update(t, levels, M, 0.3), logits)
        curl = (jacobian - jacobian.T).norm() / jacobian.norm()   # 0 iff the field is locally a gradient
        if has_curl:
            assert curl > 0.05, (levels, M, curl)
        else:
            assert curl < 1e-12, (levels, M, curl)


def test_binary_field_is_omega_times_grad_p():
    # The enumeration above agrees with Eq. (4) exactly: outcomes 1 and 2 pass, p = pi_1 + pi_2.
    logits = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    pi = torch.softmax(logits, 0)
    passes = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    p = (pi * passes).sum().item()
    for M in (2, 5):
        expected = prompt_weight(p, M, 0.3) * pi * (passes - p)
        torch.testing.assert_close(expected_update(logits, (0.0, 1.0, 1.0), M, 0.3), expected, rtol=1e-6, atol=1e-9)
