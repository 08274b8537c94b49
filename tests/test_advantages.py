"""Group advantages (softmax_grpo.group_advantages) on hand-worked examples, limits and properties.

Covers the binary closed form of SoftmaxGRPO, every other estimator on a worked
example, property tests (zero-sum, shift invariance, monotonicity) and the ESS-adaptive temperature.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from softmax_grpo import METHODS, adaptive_tau, group_advantages, softmax_advantages

GROUP_METHODS = ("softmax", "grpo", "dr_grpo", "rloo", "maxrl")


def binary_group(M, K):
    return torch.tensor([[1.0] * K + [0.0] * (M - K)])


# ---------------------------------------------------------------------------------------------------
# SoftmaxGRPO

@pytest.mark.parametrize("M", [2, 5, 8, 16])
@pytest.mark.parametrize("tau", [0.1, 0.3, 1.0, 4.0])
def test_softmax_binary_closed_form(M, tau):
    # K successes among M, c = e^{1/tau}: softmax weights are c/(Kc+M-K) and 1/(Kc+M-K).
    c = math.exp(1.0 / tau)
    for K in range(1, M):
        A = group_advantages(binary_group(M, K), "softmax", tau=tau)[0]
        A_succ = M * c / (K * c + M - K) - 1
        A_fail = M / (K * c + M - K) - 1
        expected = torch.tensor([A_succ] * K + [A_fail] * (M - K), dtype=torch.float32)
        torch.testing.assert_close(A, expected, rtol=1e-5, atol=1e-6)


def test_softmax_formula_on_scalar_rewards():
    R = torch.tensor([[0.2, 0.9, 0.5, 0.0]])
    tau = 0.3
    e = [math.exp(r / tau) for r in R[0].tolist()]
    expected = torch.tensor([[4 * x / sum(e) - 1 for x in e]])
    torch.testing.assert_close(softmax_advantages(R, tau), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(group_advantages(R, "softmax", tau=tau), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("M", [2, 4, 8])
def test_softmax_small_tau_equals_maxrl(M):
    # tau -> 0: all the weight goes to the K successes equally: M/K - 1 for them, -1 for failures (MaxRL).
    for K in range(0, M + 1):
        R = binary_group(M, K)
        soft = group_advantages(R, "softmax", tau=1e-3)
        torch.testing.assert_close(soft, group_advantages(R, "maxrl"), rtol=1e-6, atol=1e-6)
        if 0 < K < M:
            expected = torch.tensor([[M / K - 1] * K + [-1.0] * (M - K)])
            torch.testing.assert_close(soft, expected, rtol=1e-6, atol=1e-6)


def test_softmax_large_tau_is_centred_reward():
    # tau * (M softmax(R/tau) - 1) = (R - mean) + O(1/tau): a first-order Taylor expansion of exp.
    R = torch.rand(6, 8, generator=torch.Generator().manual_seed(0))
    tau = 1e3
    torch.testing.assert_close(tau * group_advantages(R, "softmax", tau=tau), R - R.mean(1, keepdim=True),
                               rtol=0, atol=2e-3)
    # ... and the limit is not approached for a moderate tau (the check can fail).
    assert (2.0 * group_advantages(R, "softmax", tau=2.0) - (R - R.mean(1, keepdim=True))).abs().max() > 1e-2


def test_softmax_tiny_tau_and_huge_rewards_stay_finite():
    R = torch.tensor([[1000.0, -1000.0, 999.0, 0.0], [1e3, 1e3, 1e3, 1e3]])
    A = group_advantages(R, "softmax", tau=1e-6)
    assert torch.isfinite(A).all()
    torch.testing.assert_close(A, torch.tensor([[3.0, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0]]))


def test_softmax_bf16_input_gives_float32_accuracy():
    R64 = torch.rand(5, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    R_bf16 = R64.to(torch.bfloat16)
    A = group_advantages(R_bf16, "softmax", tau=0.1)
    assert A.dtype == torch.float32
    # Exact float64 answer for the (bf16-rounded) rewards: agreement to float32 precision, not bf16's 1e-2.
    x = R_bf16.double() / 0.1
    w = torch.softmax(x - x.amax(1, keepdim=True), dim=1)
    torch.testing.assert_close(A.double(), 8 * w - 1, rtol=1e-5, atol=1e-5)


def test_all_equal_groups_are_exactly_zero():
    R = torch.tensor([[0.1, 0.1, 0.1], [7.3, 7.3, 7.3], [0.0, 0.0, 0.0]])
    for method in GROUP_METHODS:
        assert torch.equal(group_advantages(R, method), torch.zeros(3, 3)), method


# ---------------------------------------------------------------------------------------------------
# The other estimators on a hand-worked example
# Group 1: R = [6, 0, 2, 0]: mean 2, deviations [4, -2, 0, -2], sum of squares 24, unbiased std sqrt(8).
# Group 2: R = [5, 5, 5, 5]: all equal.

R_WORKED = torch.tensor([[6.0, 0.0, 2.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
S2 = math.sqrt(2.0)


@pytest.mark.parametrize("method, first_group", [
    ("dr_grpo", [4.0, -2.0, 0.0, -2.0]),
    ("grpo", [4 / (2 * S2 + 1e-6), -2 / (2 * S2 + 1e-6), 0.0, -2 / (2 * S2 + 1e-6)]),  # ~ [sqrt2, -1/sqrt2, ..]
    ("rloo", [6 - 2 / 3, 0 - 8 / 3, 2 - 6 / 3, 0 - 8 / 3]),                        # R_i - mean of the others
    ("maxrl", [6 / 2 - 1, -1.0, 0.0, -1.0]),                                       # R / mean - 1
])
def test_group_estimators_worked_example(method, first_group):
    expected = torch.tensor([first_group, [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(group_advantages(R_WORKED, method), expected, rtol=1e-6, atol=1e-6)


def test_batch_level_estimators_worked_example():
    # Over all 8 rewards: mean 28/8 = 3.5; squared deviations 6.25+12.25+2.25+12.25+4*2.25 = 42 -> std sqrt(42/7).
    expected = R_WORKED - 3.5
    torch.testing.assert_close(group_advantages(R_WORKED, "reinforce"), expected)
    torch.testing.assert_close(group_advantages(R_WORKED, "reinforce_pp"), expected / math.sqrt(6.0 + 1e-8))
    assert torch.equal(group_advantages(torch.full((2, 3), 0.7), "reinforce"), torch.zeros(2, 3))
    assert torch.equal(group_advantages(torch.full((2, 3), 0.7), "reinforce_pp"), torch.zeros(2, 3))


def test_reinforce_pp_whitens_over_tokens_on_a_ragged_batch():
    # REINFORCE++ (verl): every valid token carries its completion's reward; whiten over all tokens of the batch.
    # Rewards [[1, 0], [1, 1]] with lengths [[1, 3], [2, 2]]: tokens 1 x5, 0 x3 -> mean 5/8, squared deviations
    # 5 * 0.375^2 + 3 * 0.625^2 = 1.875, unbiased variance 1.875 / 7.
    rewards, lengths = torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[1, 3], [2, 2]])
    scale = math.sqrt(1.875 / 7 + 1e-8)
    expected = torch.tensor([[0.375 / scale, -0.625 / scale], [0.375 / scale, 0.375 / scale]])
    torch.testing.assert_close(group_advantages(rewards, "reinforce_pp", lengths=lengths), expected)
    tokens = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])  # the same, token by token, as verl's masked_whiten
    whitened = (tokens - tokens.mean()) / torch.sqrt(tokens.var(unbiased=True) + 1e-8)
    assert group_advantages(rewards, "reinforce_pp", lengths=lengths)[0, 1] == pytest.approx(whitened[1].item())
    # the group of all-1 rewards is NOT zero: the baseline is the batch's, not the group's
    assert (group_advantages(rewards, "reinforce_pp", lengths=lengths)[1] > 0).all()


def test_rloo_is_rescaled_dr_grpo():
    R = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(group_advantages(R, "rloo"), 6 / 5 * group_advantages(R, "dr_grpo"))


def test_maxrl_all_fail_is_zero_and_binary_is_M_over_K():
    R = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(group_advantages(R, "maxrl"), torch.tensor([[0.0] * 4, [3.0, -1.0, -1.0, -1.0]]))


@pytest.mark.parametrize("rewards, method, kwargs, message", [
    (torch.zeros(2, 4), "ppo", {}, "unknown advantage method"),
    (torch.zeros(2, 4), "softmax", {"tau": 0.0}, "tau"),
    (torch.zeros(2, 4), "softmax", {"tau": -1.0}, "tau"),
    (torch.zeros(2, 4), "softmax", {"tau": float("inf")}, "tau"),
    (torch.zeros(2, 4), "softmax", {"tau": float("nan")}, "tau"),
    (torch.zeros(3, 1), "reinforce", {}, "M >= 2 for a batch baseline"),
    (torch.zeros(8), "grpo", {}, "shape"),
    (torch.tensor([[0.0, float("nan")]]), "grpo", {}, "NaN"),
    (torch.tensor([[0.0, float("inf")]]), "softmax", {}, "inf"),
    (torch.tensor([[1.0, -1.0]]), "maxrl", {}, "maxrl"),
])
def test_bad_input_raises(rewards, method, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, method, **kwargs)


def test_methods_tuple_is_complete():
    assert set(METHODS) == {"softmax", "grpo", "dr_grpo", "rloo", "maxrl", "reinforce", "reinforce_pp"}
    for method in METHODS:
        assert group_advantages(torch.tensor([[1.0, 0.0]]), method).dtype == torch.float32


# ---------------------------------------------------------------------------------------------------
# Properties over random shapes and rewards

def reward_matrices(low, high):
    shapes = st.tuples(st.integers(1, 4), st.integers(2, 12))
    return shapes.flatmap(lambda shape: st.lists(
        st.floats(low, high, allow_nan=False, width=32), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]
    ).map(lambda values: torch.tensor(values, dtype=torch.float32).reshape(shape)))


def method_rewards():
    signed = st.sampled_from(["softmax", "grpo", "dr_grpo", "rloo"]).flatmap(
        lambda m: st.tuples(st.just(m), reward_matrices(-10, 10)))
    return signed | st.tuples(st.just("maxrl"), reward_matrices(0, 10))


@settings(max_examples=60, deadline=None)
@given(method_rewards(), st.sampled_from([0.05, 0.1, 1.0, 10.0]))
def test_group_advantages_sum_to_zero(method_and_rewards, tau):
    method, R = method_and_rewards
    A = group_advantages(R, method, tau=tau)
    assert A.shape == R.shape and torch.isfinite(A).all()
    scale = 1 + A.abs().amax(dim=1)
    # float32's R - mean cancels: an error of ~2^-23 |R| a reward, over the group's spread (grpo's std)
    cancel = R.abs().amax(dim=1) * 2.0 ** -23 / (R.std(dim=1) + 1e-6) if R.shape[1] > 1 else 0.0
    assert (A.sum(dim=1).abs() <= R.shape[1] * (1e-5 * scale + 4 * cancel)).all()


@settings(max_examples=40, deadline=None)
@given(reward_matrices(-10, 10), st.floats(-10, 10), st.sampled_from([0.05, 0.3, 2.0]))
def test_softmax_invariant_to_shifting_a_group(R, shift, tau):
    shifted = R.clone()
    shifted[0] += shift
    torch.testing.assert_close(group_advantages(shifted, "softmax", tau=tau),
                               group_advantages(R, "softmax", tau=tau), rtol=0, atol=1e-3 * R.shape[1])


@settings(max_examples=60, deadline=None)
@given(method_rewards(), st.sampled_from([0.05, 0.5]))
def test_advantage_monotonic_in_reward(method_and_rewards, tau):
    method, R = method_and_rewards
    A = group_advantages(R, method, tau=tau)
    higher = R[:, :, None] > R[:, None, :]                 # [G, i, j]: R_i > R_j
    assert (A[:, :, None] >= A[:, None, :] - 1e-6)[higher].all()


# ---------------------------------------------------------------------------------------------------
# ESS-adaptive temperature

def ess_of_softmax(k, M, tau):
    """1 / sum w^2 for the softmax(R/tau) weights of a binary group, computed directly in float64."""
    R = np.array([1.0] * k + [0.0] * (M - k))
    w = np.exp((R - 1.0) / tau)
    w /= w.sum()
    return 1.0 / np.sum(w ** 2)


@pytest.mark.parametrize("M", [4, 8, 16])
def test_adaptive_tau_hits_target_ess(M):
    for k in range(1, M):
        taus = []
        for fraction in (0.05, 0.3, 0.5, 0.8, 0.97):
            target = k + fraction * (M - k)
            tau = adaptive_tau(k, M, target)
            assert 0 < tau < math.inf
            assert abs(ess_of_softmax(k, M, tau) - target) <= 1e-6 * target
            taus.append(tau)
        assert taus == sorted(taus)  # a larger ESS needs a flatter softmax


def test_adaptive_tau_boundaries():
    assert adaptive_tau(0, 8, 4.0) is None          # all fail: weights uniform at every tau
    assert adaptive_tau(8, 8, 4.0) is None          # all succeed
    assert adaptive_tau(3, 8, 3.0) == 0.0           # target = k: MaxRL limit
    assert adaptive_tau(3, 8, 1.5) == 0.0           # below k: MaxRL limit
    assert adaptive_tau(3, 8, 8.0) == math.inf      # target = M: uniform weights
    with pytest.raises(ValueError):
        adaptive_tau(9, 8, 4.0)
    with pytest.raises(ValueError):
        adaptive_tau(3, 8, float("nan"))


def test_softmax_with_a_huge_tau_still_moves():
    # float32 weights would be exactly uniform at tau = 1e8 (A = 0, no update); float64 keeps A ~ (R - mean) / tau.
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    expected = (rewards - rewards.mean()) / 1e8
    torch.testing.assert_close(group_advantages(rewards, "softmax", tau=1e8), expected, rtol=1e-6, atol=0.0)


def test_maxrl_with_a_subnormal_group_mean_still_sums_to_zero():
    # found by hypothesis: in float32 the mean of (0, 1.1755e-38) is subnormal, and R / clamp(mean) gave (-1, 0)
    A = group_advantages(torch.tensor([[0.0, 1.1755e-38]]), "maxrl")
    assert A.tolist() == [[-1.0, 1.0]]


@pytest.mark.parametrize("method", ["softmax", "grpo", "dr_grpo", "rloo", "maxrl"])
def test_advantages_are_constants_and_a_group_of_one_gets_zero(method):
    # as the paper's code: no gradient flows through the rewards, and one completion has no baseline (verl's 0)
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], requires_grad=True)
    assert not group_advantages(rewards, method).requires_grad
    assert not softmax_advantages(rewards, 0.1).requires_grad
    single = group_advantages(torch.tensor([[1.0], [0.0], [3.0]]), method)
    assert single.shape == (3, 1) and torch.equal(single, torch.zeros(3, 1))
    assert torch.equal(softmax_advantages(torch.tensor([[2.0]]), 0.1), torch.zeros(1, 1))
