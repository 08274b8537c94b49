"""The clipped surrogate (ppo.policy_loss) and the k3 KL, on hand-computed batches."""
import math

import pytest
import torch

from ppo import clipped_token_loss, LOSS_AGGS, kl_k3, policy_loss

# A ragged batch: sequence 0 has 3 valid tokens, sequence 1 has 1 (T = 4, N = 4 valid tokens in all).
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def one_token(ratio, advantage, **kwargs):
    """Loss and d loss / d logp for a single valid token with the given ratio and advantage."""
    logprobs = leaf([[math.log(ratio)]])
    loss, stats = policy_loss(logprobs, torch.zeros(1, 1, dtype=torch.float64),
                              torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1), **kwargs)
    loss.backward()
    return loss.item(), logprobs.grad.item(), {key: value.item() for key, value in stats.items()}


def test_ratio_one_gradient_is_policy_gradient():
    # On-policy (ratio = 1): grad wrt logp_t = -A_t / N for valid tokens, 0 for padding.
    old = torch.randn(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logprobs = old.clone().requires_grad_(True)
    advantages = torch.tensor([0.7, -1.3], dtype=torch.float64)
    loss, stats = policy_loss(logprobs, old, advantages, MASK)
    loss.backward()
    expected_grad = -advantages[:, None] * MASK / 4
    torch.testing.assert_close(logprobs.grad, expected_grad)
    assert math.isclose(loss.item(), -(3 * 0.7 - 1.3) / 4)
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["clip_frac_low"] == 0 == stats["clip_frac_high"]


def test_loss_is_zero_on_first_minibatch_but_gradient_is_not():
    # Zero-sum advantages, equal lengths, ratio = 1: the loss is exactly 0 but the gradient is the policy gradient.
    logprobs = leaf([[-1.0, -2.0], [-0.5, -0.1]])
    loss, _ = policy_loss(logprobs, logprobs.detach().clone(), torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                          ref_logprobs=logprobs.detach().clone(), kl_coef=1e-3)
    loss.backward()
    assert loss.item() == 0.0
    assert logprobs.grad.abs().min() > 0.2


@pytest.mark.parametrize("ratio, advantage, zero_grad", [
    (1.5, 1.0, True),     # A > 0, ratio > 1 + clip_high: clipped, no further push up
    (1.2, 1.0, False),    # inside the trust region
    (0.5, 1.0, False),    # A > 0 below the region: the pessimistic min keeps the unclipped term
    (0.5, -1.0, True),    # A < 0, ratio < 1 - clip_low: clipped
    (0.9, -1.0, False),
    (1.5, -1.0, False),   # A < 0 above the region: unclipped (only the dual clip caps this)
])
def test_clipping(ratio, advantage, zero_grad):
    loss, grad, stats = one_token(ratio, advantage, clip_low=0.2, clip_high=0.28)
    assert (grad == 0.0) == zero_grad
    if not zero_grad:
        assert grad == pytest.approx(-advantage * ratio)   # d(-A ratio)/d logp = -A ratio
    assert stats["clip_frac_high"] == (1.0 if (advantage > 0 and ratio > 1.28) else 0.0)
    assert stats["clip_frac_low"] == (1.0 if (advantage < 0 and ratio < 0.8) else 0.0)


def test_dual_clip_caps_negative_advantages_only():
    loss, grad, stats = one_token(20.0, -1.0, dual_clip=10.0)
    assert loss == pytest.approx(10.0) and grad == 0.0 and stats["dual_clip_frac"] == 1.0
    loss, grad, _ = one_token(20.0, -1.0)
    assert loss == pytest.approx(20.0) and grad == pytest.approx(20.0)
    loss, grad, _ = one_token(5.0, -1.0, dual_clip=10.0)             # below the cap: untouched
    assert loss == pytest.approx(5.0) and grad == pytest.approx(5.0)
    loss, grad, _ = one_token(20.0, 1.0, dual_clip=10.0)             # A > 0: ordinary clip
    assert loss == pytest.approx(-1.28) and grad == 0.0
    with pytest.raises(ValueError, match="dual_clip"):
        one_token(1.0, 1.0, dual_clip=0.5)


def test_k3_values_and_clamps():
    logprobs = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    ref = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))
    assert (kl_k3(logprobs, ref) >= 0).all()
    assert torch.equal(kl_k3(logprobs, logprobs), torch.zeros(64, 16))
    d = torch.tensor([[0.5, -0.5, 1.0]])
    torch.testing.assert_close(kl_k3(torch.zeros(1, 3), d), torch.exp(d) - d - 1)
    # AR-Lopti's clamp: ref - logp = 8 is clamped to 5, then e^5 - 6 = 142.4 is clamped to 10; -8 -> -5 -> e^-5 + 4.
    torch.testing.assert_close(kl_k3(torch.zeros(1, 2), torch.tensor([[8.0, -8.0]]), log_ratio_clamp=5.0),
                               torch.tensor([[10.0, math.exp(-5) + 4]]))
    # verl's default clamp 20: -8 stays -8 (e^-8 + 7); -30 -> -20 (e^-20 + 19, then the value clamp: 10)
    torch.testing.assert_close(kl_k3(torch.zeros(1, 2), torch.tensor([[-8.0, -30.0]])),
                               torch.tensor([[math.exp(-8) + 7, 10.0]]))


def test_kl_term_uses_kl_mask_but_full_denominator():
    logprobs = leaf([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    ref = torch.full((2, 4), -1.5, dtype=torch.float64)
    kl_mask = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    loss, stats = policy_loss(logprobs, logprobs.detach().clone(), torch.zeros(2), MASK,
                              ref_logprobs=ref, kl_coef=0.5, kl_mask=kl_mask)
    loss.backward()
    k3 = math.exp(-0.5) + 0.5 - 1
    assert loss.item() == pytest.approx(0.5 * 2 * k3 / 4)           # 2 KL tokens over 4 valid tokens
    assert stats["kl"] == pytest.approx(k3)
    dk3 = 1 - math.exp(-0.5)                                         # d k3 / d logp = 1 - e^{ref - logp}
    expected = torch.zeros(2, 4, dtype=torch.float64)
    expected[:, 0] = 0.5 * dk3 / 4
    torch.testing.assert_close(logprobs.grad, expected)


# Hand-computed aggregation: ratio = 1, so the token loss is -A_t. Valid A: [1, 2, 3] and [4].
TOKEN_ADVANTAGES = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])


@pytest.mark.parametrize("loss_agg, norm_constant, expected", [
    ("token-mean", None, -(1 + 2 + 3 + 4) / 4),
    ("token-mean-per-micro-batch", None, -(1 + 2 + 3 + 4) / 4),   # one micro-batch: its token mean
    ("seq-mean-token-mean", None, -(6 / 3 + 4 / 1) / 2),
    ("seq-mean-token-sum", None, -(6 + 4) / 2),
    ("seq-mean-token-sum-norm", None, -(6 + 4) / 2 / 4),            # default constant T = 4
    ("seq-mean-token-sum-norm", 10.0, -(6 + 4) / 2 / 10),
])
def test_aggregation_modes(loss_agg, norm_constant, expected):
    logprobs = torch.zeros(2, 4)
    loss, _ = policy_loss(logprobs, logprobs, TOKEN_ADVANTAGES, MASK, loss_agg=loss_agg, norm_constant=norm_constant)
    assert loss.item() == pytest.approx(expected)
    assert set(LOSS_AGGS) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                              "token-mean-per-micro-batch"}


@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
def test_masked_tokens_contribute_nothing(loss_agg):
    generator = torch.Generator().manual_seed(3)
    old = torch.randn(2, 4, generator=generator)
    current = old + 0.3 * torch.randn(2, 4, generator=generator)
    garbage = torch.where(MASK, current, 40.0 * torch.ones(2, 4))      # huge ratios at padding
    results = []
    for values in (current, garbage):
        logprobs = values.clone().requires_grad_(True)
        loss, stats = policy_loss(logprobs, old, TOKEN_ADVANTAGES, MASK, ref_logprobs=old, kl_coef=0.1,
                                  dual_clip=3.0, loss_agg=loss_agg)
        loss.backward()
        assert (logprobs.grad[~MASK] == 0).all()
        results.append((loss.item(), logprobs.grad[MASK], stats))
    assert results[0][0] == results[1][0]
    assert torch.equal(results[0][1], results[1][1]) and results[0][2] == results[1][2]


def test_sequence_advantages_broadcast_like_token_advantages():
    generator = torch.Generator().manual_seed(4)
    old = torch.randn(2, 4, generator=generator)
    logprobs = old + 0.3 * torch.randn(2, 4, generator=generator)
    advantages = torch.tensor([1.5, -0.5])
    loss_seq, stats_seq = policy_loss(logprobs, old, advantages, MASK)
    loss_tok, stats_tok = policy_loss(logprobs, old, advantages[:, None].expand(2, 4), MASK)
    assert loss_seq.item() == loss_tok.item()
    assert {k: v.item() for k, v in stats_seq.items()} == {k: v.item() for k, v in stats_tok.items()}


def test_stats_are_detached_scalars_and_hand_counted():
    # Tokens: (A>0, ratio 1.5) clipped high; (A<0, ratio 0.5) clipped low; two ordinary tokens; one pad.
    old = torch.zeros(1, 5)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.1, 9.0]]))
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    _, stats = policy_loss(logprobs, old, advantages, mask, ref_logprobs=old)
    assert all(value.dim() == 0 and not value.requires_grad for value in stats.values())  # read once per step
    assert "dual_clip_frac" not in stats  # not measured without a dual clip: absent, not 0
    stats = {key: value.item() for key, value in stats.items()}
    assert stats["clip_frac_high"] == 0.25 and stats["clip_frac_low"] == 0.25
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.0 + 1.1) / 4)
    assert stats["ratio_max"] == pytest.approx(1.5)
    assert stats["kl"] > 0


def test_bad_input_raises():
    x = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="loss_agg"):
        policy_loss(x, x, torch.zeros(2), MASK, loss_agg="sum")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x, x, torch.zeros(3), MASK)
    with pytest.raises(ValueError, match="shape"):
        policy_loss(x, torch.zeros(2, 3), torch.zeros(2), MASK)


def test_clipped_token_loss_is_the_per_token_surrogate():
    # The copyable core: [B, T] in, [B, T] out, equal to the hand formula on every token (no mask, no mean).
    old = torch.zeros(2, 3)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.0], [0.7, 20.0, 1.1]]))
    advantages = torch.tensor([[1.0, -1.0, 2.0], [-1.0, -1.0, 1.0]])
    expected = torch.tensor([[-1.28, 0.8, -2.0], [0.8, 10.0, -1.1]])  # clip high, clip low, ratio 1; dual cap 10
    got = clipped_token_loss(logprobs, old, advantages, clip_low=0.2, clip_high=0.28, dual_clip=10.0)
    torch.testing.assert_close(got, expected)
    assert got.shape == logprobs.shape
