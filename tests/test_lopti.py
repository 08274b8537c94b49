"""Advantage Reweighting and Lopti (lopti.py), and Prop. 4.2 of Yang et al. 2505.12929."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lopti import PASS_ORDERS, isolation_masks, logit_grad_norm_bounds, lopti_passes, reweight_advantages
from ppo import policy_loss

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
PROBS = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.2, 0.7, 0.6, 0.6]])


# ---------------------------------------------------------------------------------------------------
# Advantage Reweighting and the Lopti split

def test_reweighting_formula_by_hand():
    A = torch.tensor([2.0, -1.0])
    # (0.3 p + 0.7) A: [0.73, 0.97, 0.85] * 2 and [0.76, 0.91] * -1; padding is 0.
    expected = torch.tensor([[1.46, 1.94, 1.70, 0.0], [-0.76, -0.91, 0.0, 0.0]])
    torch.testing.assert_close(reweight_advantages(A, PROBS, MASK, alpha=0.3), expected)
    torch.testing.assert_close(reweight_advantages(A, PROBS, MASK, alpha=1.0), torch.where(MASK, PROBS * A[:, None], 0.0))
    # alpha = 0 is the identity (broadcast over valid tokens); token-level input is accepted as well.
    identity = torch.where(MASK, A[:, None].expand(2, 4), 0.0)
    torch.testing.assert_close(reweight_advantages(A, PROBS, MASK, alpha=0.0), identity)
    torch.testing.assert_close(reweight_advantages(identity, PROBS, MASK, alpha=0.0), identity)
    with pytest.raises(ValueError, match="alpha"):
        reweight_advantages(A, PROBS, MASK, alpha=1.5)
    # alpha = 0 reads no p_old (train.py's speed rule measures none); alpha > 0 needs it
    torch.testing.assert_close(reweight_advantages(A, None, MASK, alpha=0.0), identity)
    with pytest.raises(ValueError, match="reads p_old"):
        reweight_advantages(A, None, MASK, alpha=0.3)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.floats(0.0, 1.0), st.integers(0, 10_000))
def test_masks_partition_valid_tokens(B, T, eta, seed):
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(B, T, generator=generator)
    mask = torch.rand(B, T, generator=generator) < 0.7
    low, high = isolation_masks(probs, mask, eta)
    assert low.dtype == torch.bool and high.dtype == torch.bool
    assert not (low & high).any() and torch.equal(low | high, mask)
    assert (probs[low] < eta).all() and (probs[high] >= eta).all()


def test_pass_order_and_zeroing():
    token_adv = reweight_advantages(torch.tensor([2.0, -1.0]), PROBS, MASK, alpha=0.0)
    passes = lopti_passes(token_adv, PROBS, MASK, eta=0.5)
    assert [name for name, _, _ in passes] == ["low", "high"]
    (_, low_adv, low_mask), (_, high_adv, high_mask) = passes
    torch.testing.assert_close(low_mask, torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool))
    torch.testing.assert_close(high_mask, torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.bool))
    torch.testing.assert_close(low_adv + high_adv, token_adv)
    assert (low_adv[~low_mask] == 0).all() and (high_adv[~high_mask] == 0).all()
    assert [name for name, _, _ in lopti_passes(token_adv, PROBS, MASK, 0.5, order="high-first")] == ["high", "low"]
    (name, adv, mask), = lopti_passes(token_adv, PROBS, MASK, eta=0.0)       # Lopti off
    assert name == "all" and adv is token_adv and mask is MASK
    assert PASS_ORDERS == ("low-first", "high-first")
    with pytest.raises(ValueError, match="order"):
        lopti_passes(token_adv, PROBS, MASK, 0.5, order="random")


def two_pass_update(order):
    """One Lopti step on a toy policy whose logits are a free table W[t] per position (so row t moves only if
    token t carries gradient). Returns W before, after pass 1 and after pass 2, and the pass names."""
    torch.manual_seed(0)
    vocab, T = 5, 4
    logits = torch.zeros(T, vocab)
    logits[0, 0] = logits[1, 1] = 3.0              # positions 0, 1: sampled token has p ~ 0.83 (high)
    logits[2, 2] = logits[3, 3] = -1.0             # positions 2, 3: sampled token has p ~ 0.08 (low)
    W = torch.nn.Parameter(logits)
    tokens = torch.tensor([[0, 1, 2, 3]])
    mask = torch.ones(1, T, dtype=torch.bool)

    def token_logprobs():
        return torch.log_softmax(W, dim=-1).gather(1, tokens.T).T            # [1, T]

    old_logprobs = token_logprobs().detach()
    ref_logprobs = old_logprobs + 0.5              # a reference that differs, so the KL term has a gradient
    token_adv = reweight_advantages(torch.tensor([1.0]), old_logprobs.exp(), mask, alpha=0.3)
    optimizer = torch.optim.SGD([W], lr=0.5)
    snapshots, names, first_grad = [W.detach().clone()], [], None
    for name, pass_adv, pass_mask in lopti_passes(token_adv, old_logprobs.exp(), mask, eta=0.5, order=order):
        loss, _ = policy_loss(token_logprobs(), old_logprobs, pass_adv, mask,
                              ref_logprobs=ref_logprobs, kl_coef=0.1, kl_mask=pass_mask)
        optimizer.zero_grad()
        loss.backward()
        first_grad = W.grad.clone() if first_grad is None else first_grad
        optimizer.step()
        snapshots.append(W.detach().clone())
        names.append(name)
    return snapshots, names, token_adv, old_logprobs, first_grad


@pytest.mark.parametrize("order, first, second", [("low-first", [2, 3], [0, 1]), ("high-first", [0, 1], [2, 3])])
def test_two_pass_update_moves_the_first_set_first(order, first, second):
    (before, after_1, after_2), names, _, _, _ = two_pass_update(order)
    assert names == (["low", "high"] if order == "low-first" else ["high", "low"])
    moved_1 = (after_1 != before).any(dim=1)
    moved_2 = (after_2 != after_1).any(dim=1)
    assert moved_1[first].all() and not moved_1[second].any()       # pass 1 touched only its positions
    assert moved_2[second].all() and not moved_2[first].any()       # pass 2 the others (KL masked too)


def test_first_pass_gradient_uses_full_denominator():
    # Pass 1 on an unchanged policy: ratio = 1 and d loss / d z_t = -(A'_t / N) (onehot - softmax) + KL term,
    # with N = 4 valid tokens (the full mask), not the 2 tokens of the pass.
    (before, _, _), _, token_adv, old_logprobs, first_grad = two_pass_update("low-first")
    probs = torch.softmax(before, dim=-1)
    for t in (2, 3):
        score = torch.nn.functional.one_hot(torch.tensor(t), 5).float() - probs[t]
        dk3 = 1 - math.exp(0.5)                                         # d k3 / d logp at ref - logp = 0.5
        expected = (-token_adv[0, t] / 4 + 0.1 * dk3 / 4) * score
        torch.testing.assert_close(first_grad[t], expected)


# ---------------------------------------------------------------------------------------------------
# Prop. 4.2: sqrt(N/(N-1)) (1 - pi_o) <= || d log pi_o / d z || <= sqrt(2) (1 - pi_o)

@pytest.mark.parametrize("vocab", [2, 3, 10, 1000])
def test_prop_4_2_gradient_norm_bounds(vocab):
    generator = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(200, vocab, generator=generator, dtype=torch.float64)
              * torch.rand(200, 1, generator=generator, dtype=torch.float64) * 6).requires_grad_(True)
    tokens = torch.randint(vocab, (200,), generator=generator)
    log_pi = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    log_pi.sum().backward()                                    # row b of the gradient = onehot(o_b) - pi_b
    norms = logits.grad.norm(dim=1)
    lower, upper = logit_grad_norm_bounds(log_pi.detach().exp(), vocab)
    assert (norms >= lower - 1e-12).all() and (norms <= upper + 1e-12).all()   # equality for N = 2


def test_prop_4_2_bounds_are_tight():
    vocab, pi_o = 10, 0.3
    uniform_rest = torch.full((vocab,), (1 - pi_o) / (vocab - 1), dtype=torch.float64)
    uniform_rest[0] = pi_o
    one_rival = torch.zeros(vocab, dtype=torch.float64)
    one_rival[0], one_rival[1] = pi_o, 1 - pi_o
    lower, upper = logit_grad_norm_bounds(pi_o, vocab)
    onehot = torch.nn.functional.one_hot(torch.tensor(0), vocab).double()
    assert (onehot - uniform_rest).norm().item() == pytest.approx(lower, rel=1e-12)   # mass spread evenly
    assert (onehot - one_rival).norm().item() == pytest.approx(upper, rel=1e-12)      # mass on one rival
    assert logit_grad_norm_bounds(pi_o, 2)[0] == pytest.approx(logit_grad_norm_bounds(pi_o, 2)[1])  # N = 2: equal
