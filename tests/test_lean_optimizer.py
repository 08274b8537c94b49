"""Full-parameter training without fp32 masters (harness/lean_optimizer.py): bf16 weights stochastically rounded
(--param-dtype bf16-sr) and the optimizer step taken inside backward (--step-in-backward).

Derivations: stochastic rounding is exactly unbiased (every noise value enumerated); a small step that
round-to-nearest loses every time is kept on average (Monte Carlo with its tolerance); on fp32 weights the step is
torch's AdamW bit for bit; stepping in backward is the plain step bit for bit when one backward makes the step; a
resume continues the same noise stream."""
import copy
import json
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoModelForCausalLM

import train
from harness.config import Config
from harness.model import enable_checkpointing
from harness import lean_optimizer
from harness.lean_optimizer import LeanAdamW, stochastic_round_bf16
from tests.stubs import SMALL_TRAIN as SMALL, assert_resume_from_checkpoint_2_continues, tiny_policy_and_rollouts
from rollout import token_logprobs

SPACING_AT_1 = 2.0 ** -7  # bf16 keeps 7 mantissa bits: neighbours in [1, 2) are 2**-7 apart


# --- stochastic rounding ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", [1.0 + 0.3 * SPACING_AT_1, -(1.0 + 0.7 * SPACING_AT_1), 3e-5, 1.0 + SPACING_AT_1])
def test_stochastic_rounding_is_exactly_unbiased_over_every_noise_value(x):
    # The fp32 value's low 16 bits are k: the noise n carries into bit 16 iff n >= 2**16 - k, for k of the 2**16
    # values; so the mean over all of them is lo + (k / 2**16) (hi - lo) = x exactly (x representable: k = 0)
    value = torch.tensor(x, dtype=torch.float32)
    noise = torch.arange(2 ** 16, dtype=torch.int32)
    rounded = stochastic_round_bf16(value.expand(2 ** 16), noise).double()
    assert rounded.mean().item() == pytest.approx(value.double().item(), abs=0, rel=1e-15)
    lo, hi = rounded.min().item(), rounded.max().item()
    assert set(rounded.unique().tolist()) <= {lo, hi}  # only the two bf16 neighbours of x
    assert (hi == lo) == (value.to(torch.bfloat16).float() == value).item()


def test_stochastic_rounding_passes_inf_and_nan_and_never_makes_a_nan():
    x = torch.tensor([math.inf, -math.inf, math.nan, 3.3895e38, -3.3895e38, 0.0, -0.0])
    noise = torch.full(x.shape, 2 ** 16 - 1, dtype=torch.int32)  # the largest carry
    out = stochastic_round_bf16(x, noise)
    assert out[:2].tolist() == [math.inf, -math.inf] and math.isnan(out[2].item())
    assert not out[3:].isnan().any() and out[5:].tolist() == [0.0, 0.0]


def test_small_steps_are_kept_on_average_where_round_to_nearest_loses_them():
    # 1000 steps of +1e-4 from 1.0 (each 0.0128 of a spacing, below half of one): to nearest, 1.0 stays 1.0; each
    # stochastic rounding is unbiased, so E[w] = 1 + 0.1. Each step adds a variance <= SPACING**2 / 4, so over
    # 1000 steps one weight's sd is <= sqrt(1000) SPACING / 2 = 0.124 and the mean of 20 000 weights' <= 0.00087:
    # 6 sd = 0.0053
    n, steps, delta = 20_000, 1000, 1e-4
    generator = torch.Generator().manual_seed(0)
    nearest = torch.ones(n, dtype=torch.bfloat16)
    stochastic = torch.ones(n, dtype=torch.bfloat16)
    for _ in range(steps):
        nearest = (nearest.float() + delta).to(torch.bfloat16)
        noise = torch.randint(0, 2 ** 16, (n,), generator=generator, dtype=torch.int32)
        stochastic = stochastic_round_bf16(stochastic.float() + delta, noise)
    assert torch.equal(nearest, torch.ones(n, dtype=torch.bfloat16))  # every update lost
    assert abs(stochastic.double().mean().item() - (1 + steps * delta)) < 6 * math.sqrt(steps) * SPACING_AT_1 / 2 \
        / math.sqrt(n)


# --- the AdamW step ----------------------------------------------------------------------------------------------
def random_grads(shapes, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(steps)]


def test_on_fp32_weights_the_step_is_torchs_adamw_bit_for_bit():
    shapes = [(5, 3), (7,), (300, 10)]
    starts = [torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i, shape in enumerate(shapes)]
    ours = [t.clone().requires_grad_() for t in starts]
    theirs = [t.clone().requires_grad_() for t in starts]
    lean = LeanAdamW(ours, lr=1e-3, weight_decay=0.01)
    plain = torch.optim.AdamW(theirs, lr=1e-3, weight_decay=0.01, foreach=False)
    for step, grads in enumerate(random_grads(shapes, 5)):
        for a, b, grad in zip(ours, theirs, grads):
            a.grad, b.grad = (None, None) if step == 2 and a.dim() == 1 else (grad.clone(), grad.clone())
        lean.step(), plain.step()
        assert all(a.grad is None for a in ours)  # each gradient freed after its step
    for a, b in zip(ours, theirs):
        assert torch.equal(a.detach(), b.detach())
        assert torch.equal(lean.state[a]["exp_avg_sq"], plain.state[b]["exp_avg_sq"])


def test_bf16_sr_follows_the_fp32_path_on_average_with_steps_below_half_a_spacing():
    # AdamW at lr 1e-4, no decay, a steady push: each weight moves ~1e-4 a step, 0.0128 of a spacing at 1, so bf16
    # rounded to nearest never moves. Stochastic rounding gets the same AdamW updates as fp32 (the moments do not
    # read the weight) and adds an unbiased error of variance <= SPACING**2 / 4 a step: after 200 steps one weight
    # is off the fp32 path by sd <= sqrt(200) SPACING / 2 = 0.055, the mean of 16 384 weights by <= 0.00043, and
    # 6 sd = 0.0026 against the drift of ~0.02 that round-to-nearest loses
    n, steps = 16_384, 200
    start = torch.ones(n)
    sr = start.to(torch.bfloat16).requires_grad_()
    fp32 = start.clone().requires_grad_()
    nearest = start.to(torch.bfloat16).requires_grad_()
    optimizers = [LeanAdamW([sr], lr=1e-4, weight_decay=0.0, seed=1),
                  torch.optim.AdamW([fp32], lr=1e-4, weight_decay=0.0),
                  torch.optim.AdamW([nearest], lr=1e-4, weight_decay=0.0)]
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        grad = -(1 + 0.5 * torch.randn(n, generator=generator)).to(torch.bfloat16)  # the same in every dtype
        sr.grad, fp32.grad, nearest.grad = grad.clone(), grad.float(), grad.clone()
        for optimizer in optimizers:
            optimizer.step()
    drift = (fp32.detach().double() - 1).mean().item()
    assert 0.015 < drift < 0.025  # ~1e-4 a step for 200 steps
    assert torch.equal(nearest.detach(), torch.ones(n, dtype=torch.bfloat16))  # round to nearest: nothing learned
    assert abs((sr.detach().double() - 1).mean().item() - drift) < 6 * math.sqrt(steps) * SPACING_AT_1 / 2 \
        / math.sqrt(n)
    assert sr.dtype == torch.bfloat16 and not hasattr(optimizers[0], "masters")


@pytest.mark.parametrize("moments", ["fp32", "8bit"])
def test_a_resume_continues_the_same_steps_and_noise(moments):
    if moments == "8bit":
        pytest.importorskip("torchao", reason="8-bit moments use torchao's quantization")
    shapes = [(64, 64), (7,)]  # 4096 weights: 8-bit moments; 7: fp32 ones
    starts = [torch.randn(s, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
              for i, s in enumerate(shapes)]
    ours = [t.clone().requires_grad_() for t in starts]
    lean = LeanAdamW(ours, lr=1e-3, seed=3, moments=moments)
    grads = random_grads(shapes, 6)
    for step_grads in grads[:3]:
        for a, g in zip(ours, step_grads):
            a.grad = g.to(torch.bfloat16)
        lean.step()
    saved = copy.deepcopy(lean.state_dict())
    again = [p.detach().clone().requires_grad_() for p in ours]
    resumed = LeanAdamW(again, lr=1e-3, seed=0, moments=moments)
    resumed.load_state_dict(saved)  # the seed comes from the state
    for step_grads in grads[3:]:
        for a, c, g in zip(ours, again, step_grads):
            a.grad, c.grad = g.to(torch.bfloat16), g.to(torch.bfloat16)
        lean.step(), resumed.step()
    assert all(torch.equal(a.detach(), c.detach()) for a, c in zip(ours, again))
    dtypes = {lean.state[p]["exp_avg"].dtype for p in ours}
    assert dtypes == ({torch.uint8, torch.float32} if moments == "8bit" else {torch.float32})


def test_8bit_moments_track_fp32_moments():
    pytest.importorskip("torchao", reason="8-bit moments use torchao's quantization")
    shapes = [(128, 64)]
    start = torch.randn(shapes[0], generator=torch.Generator().manual_seed(0))
    runs = {}
    for moments in ("fp32", "8bit"):
        weight = start.clone().requires_grad_()
        lean = LeanAdamW([weight], lr=1e-3, moments=moments)
        for (grad,) in random_grads(shapes, 10):
            weight.grad = grad
            lean.step()
        runs[moments] = weight.detach()
    moved = (runs["fp32"] - start).abs().sum()
    assert (runs["8bit"] - runs["fp32"]).abs().sum() < 0.1 * moved  # the same steps up to quantization


# --- the step in backward ----------------------------------------------------------------------------------------
def trained_in(step_in_backward, dtype, checkpointing):
    """The tiny Llama (tied embeddings: one weight read twice) after 3 AdamW steps on its rollouts' log-probs."""
    _, model, rollouts = tiny_policy_and_rollouts()
    model = model.to(dtype)
    if checkpointing:
        enable_checkpointing(model)  # each layer recomputed in backward, after later layers have stepped
    model.train()
    optimizer = LeanAdamW(model.parameters(), lr=1e-2, seed=0, step_in_backward=step_in_backward)
    for _ in range(3):
        logprobs = token_logprobs(model, rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask)
        (-(logprobs * rollouts.completion_mask).sum()).backward()
        if step_in_backward:
            assert all(p.grad is None for p in model.parameters())  # stepped and freed inside backward
        optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("dtype, checkpointing", [(torch.float32, False), (torch.bfloat16, False),
                                                  (torch.float32, True)])
def test_stepping_in_backward_is_the_plain_step_bit_for_bit(one_thread, dtype, checkpointing):
    plain, in_backward = trained_in(False, dtype, checkpointing), trained_in(True, dtype, checkpointing)
    _, start, _ = tiny_policy_and_rollouts()
    assert any(not torch.equal(v.to(dtype), plain[k]) for k, v in start.state_dict().items())  # it trained
    assert all(torch.equal(plain[k], in_backward[k]) for k in plain)


def test_stepping_in_backward_keeps_the_gradient_norm_it_could_not_clip():
    weight = torch.ones(4, requires_grad=True)
    optimizer = LeanAdamW([weight], lr=0.1, step_in_backward=True)
    (weight * torch.tensor([3.0, 4.0, 0.0, 0.0])).sum().backward()
    assert weight.grad is None and optimizer.grad_norm().item() == pytest.approx(5.0)
    optimizer.zero_grad()
    assert optimizer.grad_norm().item() == 0.0


class LargestFloat32Made(TorchDispatchMode):
    """Records the most elements of any new float32 tensor an op makes (views and in-place results not counted)."""
    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info for r in func._schema.returns):
            made = [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.dtype == torch.float32]
            self.largest = max([self.largest, *made])
        return out


def test_a_step_in_backward_makes_no_fp32_copy_of_a_whole_gradient(monkeypatch):
    # a bf16 weight of 8 chunks, its fp32 moments made by a first step: the second step and the norm the clip would
    # read work a chunk at a time, so no float32 tensor larger than a chunk is made (a whole-gradient .float() would
    # make one of 8 192), and the norm summed over the chunks is the gradient's norm
    monkeypatch.setattr(lean_optimizer, "CHUNK", 1024)
    weight = torch.zeros(8 * 1024, dtype=torch.bfloat16, requires_grad=True)
    push = torch.linspace(-2, 2, weight.numel()).to(torch.bfloat16)
    optimizer = LeanAdamW([weight], lr=0.1, step_in_backward=True)
    (weight * push).sum().backward()
    optimizer.zero_grad()
    before = weight.detach().clone()
    with LargestFloat32Made() as recorder:
        (weight * push).sum().backward()
    assert weight.grad is None and not torch.equal(weight.detach(), before)  # stepped and freed in backward
    assert recorder.largest <= 1024
    assert optimizer.grad_norm().item() == pytest.approx(push.double().norm().item(), rel=1e-6)


# --- the settings ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, message", [
    (dict(step_in_backward=True), "--step-in-backward steps each weight during backward"),
    (dict(step_in_backward=True, grad_clip=0.0, micro_batch=2), "--step-in-backward takes the optimizer step in each "
                                                                "backward, so one micro-batch must make it"),
    (dict(step_in_backward=True, grad_clip=0.0, param_dtype="bf16", dtype="bf16"), "keeps no fp32 masters"),
    (dict(grad_clip=0.0), "--grad-clip must be > 0 (0 = off: only with --step-in-backward)"),
    (dict(param_dtype="bf16-sr", dtype="fp32"), "--param-dtype bf16-sr computes in bf16")])
def test_settings_the_step_in_backward_cannot_honour_are_one_line(fields, message):
    base = dict(prompts_per_step=2, num_generations=4, micro_batch=8)
    with pytest.raises(ValueError) as error:
        Config(**{**base, **fields}).validate()
    assert message in str(error.value)


# --- a run ---------------------------------------------------------------------------------------------------------
LEAN = ["--param-dtype", "bf16-sr", "--step-in-backward", "--grad-clip", "0", "--micro-batch", "8"]


def test_a_lean_run_stores_bf16_loads_in_plain_transformers_and_resumes_exactly(tmp_path, digits_task):
    out = tmp_path / "run"
    train.main(["--task", "digits", "--output-dir", str(out), *SMALL, "--steps", "4", "--save-every", "2",
                "--keep-checkpoints", "0", *LEAN])
    final = AutoModelForCausalLM.from_pretrained(out / "checkpoint-4")  # plain transformers, no flag
    assert {p.dtype for p in final.parameters()} == {torch.bfloat16}
    start = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2").state_dict()
    assert any(not torch.equal(start[k], v) for k, v in final.state_dict().items())  # it trained
    state = torch.load(out / "checkpoint-4" / "trainer_state.pt", weights_only=True)["optimizer"]
    assert "masters" not in state and all(s["exp_avg"].dtype == torch.float32 for s in state["state"].values())
    rows = (out / "metrics.jsonl").read_text()
    assert all(row["grad_norm"] > 0 for row in map(json.loads, rows.splitlines()) if row.get("optimizer_steps"))
    assert_resume_from_checkpoint_2_continues(out, final)
