"""fast/logprobs.py's LM head: TF32 only where asked, switched through torch's own API and given back exactly; how
many tokens it takes at once (a fixed rule, the same on every card), counted by the memory plan and recorded."""
import types

import pytest
import torch

import train
from fast import logprobs
from harness import memory
from harness.config import Config
from tests.stubs import tiny_policy_and_rollouts

MATMUL = torch.backends.cuda.matmul
NEW_API = hasattr(MATMUL, "fp32_precision")  # torch >= 2.9


@pytest.fixture
def precision_given_back():
    """Whatever a test sets, the process's float32 matmul precision is 'none' (torch's default) after it."""
    yield
    if NEW_API:
        MATMUL.fp32_precision = "none"


def head_settings_seen(monkeypatch, tf32):
    """Run TensorCoreHead's forward and backward on a CPU (where the flag changes no number), recording the setting
    each of its three matmuls saw -> (the settings, logits, features, weight)."""
    seen, matmul = [], torch.matmul
    name = "fp32_precision" if NEW_API else "allow_tf32"
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: (seen.append(getattr(MATMUL, name)), matmul(a, b))[1])
    features = torch.randn(5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    logits = logprobs.TensorCoreHead.apply(features, weight, tf32)
    logits.sin().sum().backward()
    monkeypatch.undo()
    return seen, logits, features, weight


@pytest.mark.skipif(not NEW_API, reason="torch < 2.9 has no fp32_precision")
@pytest.mark.parametrize("before", ["none", "ieee", "tf32"])
@pytest.mark.parametrize("tf32", [True, False], ids=["tf32", "ieee"])
def test_the_head_sets_fp32_precision_in_its_three_matmuls_and_gives_back_exactly_what_was_there(
        before, tf32, monkeypatch, precision_given_back):
    # A process that set torch's new API (transformers' enable_tf32 does) makes reading the legacy allow_tf32 raise
    # a RuntimeError; the head reads and writes only fp32_precision, and gives back 'none' as 'none' (not 'ieee').
    MATMUL.fp32_precision = before
    if before == "tf32":  # what 2c9f269's head read first
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            MATMUL.allow_tf32
    seen, logits, features, weight = head_settings_seen(monkeypatch, tf32)
    assert seen == ["tf32" if tf32 else "ieee"] * 3 and MATMUL.fp32_precision == before
    exact_features, exact_weight = features.detach().requires_grad_(), weight.detach().requires_grad_()
    exact = torch.nn.functional.linear(exact_features, exact_weight)
    exact.sin().sum().backward()
    assert torch.equal(logits, exact)  # a CPU has no TF32: the exact float32 values and gradients
    torch.testing.assert_close(features.grad, exact_features.grad, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(weight.grad, exact_weight.grad, atol=1e-6, rtol=1e-6)


def test_before_torch_2_9_the_head_switches_allow_tf32_and_gives_it_back(monkeypatch):
    legacy = types.SimpleNamespace(allow_tf32=False)  # torch < 2.9's flags: no fp32_precision
    monkeypatch.setattr(torch.backends.cuda, "matmul", legacy)
    for tf32 in (True, False):
        for before in (False, True):
            legacy.allow_tf32 = before
            with logprobs.fp32_matmuls(tf32):
                assert legacy.allow_tf32 is tf32
            assert legacy.allow_tf32 is before and not hasattr(legacy, "fp32_precision")


@pytest.mark.parametrize("dtype, logprob_fp32, tf32", [("bf16", False, True), ("fp32", False, False),
                                                       ("bf16", True, False)],
                         ids=["bf16: tf32", "--dtype fp32: ieee", "--logprob-fp32: ieee"])
def test_the_update_asks_for_tf32_only_under_a_bf16_body(dtype, logprob_fp32, tf32, monkeypatch):
    # --dtype reaches the head as the autocast around token_logprobs (fast/update.py), --logprob-fp32 as
    # body_autocast=False: the head's rounding follows the body's, so only a bf16 body gets TF32
    seen, exact = set(), logprobs.head_matmul
    monkeypatch.setattr(logprobs, "head_matmul", lambda f, w, tf32: (seen.add(tf32), exact(f, w, tf32))[1])
    tokenizer, policy, r = tiny_policy_and_rollouts()
    config = Config(dtype=dtype, logprob_fp32=logprob_fp32, micro_batch=3, max_new_tokens=6, fast=True)
    train.update_batch(policy, torch.optim.SGD(policy.parameters(), lr=0.1), r.input_ids, r.attention_mask,
                       r.completion_mask, torch.linspace(-1, 1, len(r.input_ids)), config)
    assert seen == {tf32}


def test_the_one_chunk_rule_is_fixed_whatever_memory_the_card_has_free(monkeypatch):
    # 4 logit chunks' tokens or fewer: one chunk, no recompute, on CUDA; more: logit_chunk at a time. Free memory
    # (a roomy H200 or a full H100) is never read: the same command runs the same head code on every card.
    for free in (1 << 20, 1 << 40):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 1 << 40), raising=False)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: free, raising=False)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0, raising=False)
        assert [logprobs.head_tokens_at_once(tokens, "cuda", 1024) for tokens in (100, 4096, 4097, 16384)] == \
            [100, 4096, 1024, 1024]
    assert logprobs.WHOLE_HEAD_CHUNKS == 4
    # a CPU keeps logit_chunk (the bits of the shipped CPU runs)
    assert logprobs.head_tokens_at_once(10**6, "cpu", 1024) == logprobs.head_tokens_at_once(100, "cpu", 1024) == 1024


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("micro_batch, logit_chunk", [(16, 1024), (64, 1024), (8, 256), (2, 1024), (64, 4096)])
def test_the_memory_plan_counts_the_logits_the_head_holds_at_once(device, micro_batch, logit_chunk):
    # random_model_step's micro-batch 16 x 256 tokens on CUDA: 4096 tokens in one chunk, 7.5 GB of float32 logits
    # and temporaries at Qwen2.5's vocabulary (the plan said 1.9 GB before); micro-batch 64: 1024 at a time
    shape = memory.QWEN25["qwen2.5-0.5b"]
    config = Config(device=device, dtype="bf16", prompts_per_step=16, num_generations=8, max_new_tokens=256,
                    micro_batch=micro_batch, logit_chunk=logit_chunk)
    plan = memory.memory_plan(shape, config, 32)
    tokens = micro_batch * 256
    at_once = min(logprobs.head_tokens_at_once(tokens, device, logit_chunk), tokens)  # chunked_logprobs' largest
    assert plan["logit_chunk"] == 3 * 4 * shape.vocab * at_once and plan["assumed"]["head_tokens_at_once"] == at_once
    if (device, micro_batch, logit_chunk) == ("cuda", 16, 1024):
        assert at_once == 4096 and round(plan["logit_chunk"] / 1e9, 1) == 7.5


def test_each_head_forward_records_the_branch_it_took():
    # benchmarks/step_time.py writes this count into its --json (gpu_check.sh's step.json)
    tokenizer, policy, r = tiny_policy_and_rollouts()
    tokens = r.completion_mask.shape[1] * 4  # 4 rows a micro-batch
    for logit_chunk, branch in ((tokens, "one chunk"), (tokens - 1, "chunks")):
        before = logprobs.HEAD_BRANCHES[branch]
        logprobs.token_logprobs(policy, r.input_ids, r.attention_mask, r.completion_mask, temperature=1.0,
                                micro_batch=4, with_entropy=False, logit_chunk=logit_chunk, fp32_head=True,
                                body_autocast=True, share_prompts=True)
        assert logprobs.HEAD_BRANCHES[branch] == before + 2  # 8 rows: two micro-batches
