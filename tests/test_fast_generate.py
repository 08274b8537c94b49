"""fast/generate.py and fast/kv_cache.py. The fast path (on by default: the shared prefill and the roomy cache, keys
and values written in place instead of concatenated) gives rollout.py's generate the same completions as its plain call
(--no-fast) and as HF's DynamicCache, token for token, on every path (greedy, sampled, --rollout-batch, dropping
finished rows, no shared prefill, several layers with grouped-query attention). The first-CUDA-rollout self-check,
forced on this CPU: it passes when the paths agree, and a mismatch injected into the roomy cache makes it say so in
one line and generate with the plain call.
The --fast-generate path: the static KV cache filled from the shared prefill and the decode loop (one step with
generate's sampling inside, the stop check every k tokens) give the same completions as rollout.py's plain generate
call: greedy token for token, and sampled token for token under the same seed (the step draws the random numbers of
generate's torch.multinomial and picks its token; only the logits' forward changes, by float rounding), fp32 and under
bf16 autocast, with rows ending at EOS inside a stop-check block (their extra steps cut, their draws undone: the random
numbers after the call are the plain call's), with the loop's CUDA-graph branch run on this CPU with torch.cuda's graph
API stood in. Where the loop does not apply, generate's own compiled static-cache call: the same completions; its
compiled tests are slow (inductor compiles on the CPU: minutes on a shared machine)."""
import copy

import pytest
import torch
from transformers import LlamaForCausalLM

import tasks
from fast import decode_loop as fast_loop, generate as fast_generate, kv_cache
from harness.config import Config
from harness.tiny import build_char_tokenizer, build_tiny_model
from tests.stubs import generate_rollouts, smollm2_or_skip

# transformers before the layered cache API (the floor of requirements.txt): no roomy or static cache, the plain one
layered = pytest.mark.skipif(not kv_cache.LAYERED_CACHE, reason="no layered cache API in this transformers")


def tiny_setup():
    """A 1-layer, 32-wide tiny Llama at init, three prompts of different lengths (left padding)."""
    tokenizer = build_char_tokenizer(tasks.COMPACT_ALPHABET)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    prompts = [tokenizer(text)["input_ids"] for text in ("12 5>7:", "3>9:", "45 6 7>1:")]
    return tokenizer, model, prompts


def both_paths(model, tokenizer, prompts, seed, **options):
    """(plain, fast) Rollouts of the same prompts under the same seed."""
    result = []
    for fast in (False, True):
        torch.manual_seed(seed)
        result.append(generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8, fast_generate=fast,
                                        **options))
    return result


def assert_same(plain, fast):
    assert torch.equal(plain.input_ids, fast.input_ids)
    assert torch.equal(plain.attention_mask, fast.attention_mask)
    assert torch.equal(plain.completion_mask, fast.completion_mask)
    assert torch.equal(plain.truncated, fast.truncated) and plain.completions == fast.completions


# --------------------------------------------------------------------------------------------------
# The roomy cache: DynamicCache's layers, written in place
# --------------------------------------------------------------------------------------------------
def concatenating_and_roomy(monkeypatch, model, tokenizer, prompts, seed, **options):
    """(HF's DynamicCache as it is, the roomy cache) Rollouts of the same prompts under the same seed."""
    result = []
    for roomy in (False, True):
        with monkeypatch.context() as patch:
            if not roomy:
                patch.setattr(kv_cache, "roomy_cache", kv_cache.concatenating_cache)
            torch.manual_seed(seed)
            result.append(generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8, **options))
    return result


def plain_call(model, tokenizer, prompts, seed, **options):
    """The Rollouts of rollout.py's plain generate call (--no-fast) under the seed: one generate call (dropping
    finished rows is a fast path: other random draws, so a sampled comparison with it is greedy only)."""
    torch.manual_seed(seed)
    return generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8, fast=False, **options)


@pytest.mark.parametrize("options", [dict(greedy=True), dict(), dict(rollout_batch=4), dict(temperature=0.7),
                                     dict(drop_finished_every=2), dict(share_prefill=False)])
def test_roomy_cache_samples_alike(monkeypatch, one_thread, options):
    tokenizer, model, prompts = tiny_setup()
    config = build_tiny_model(tokenizer, hidden_size=64, num_layers=3, num_heads=4).config
    config.num_key_value_heads = 2  # grouped-query attention, as SmolLM2's 9 query heads on 3 KV heads
    torch.manual_seed(1)
    wide = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] *= 0  # rows stop at different steps (drop_finished_every)
    eager = copy.deepcopy(wide)
    eager.config._attn_implementation = "eager"  # as the benchmarks run the tiny model: matmuls on the views
    selected, select = [], kv_cache.RoomyLayer.batch_select_indices  # count generate's drops of rows
    monkeypatch.setattr(kv_cache.RoomyLayer, "batch_select_indices",
                        lambda layer, indices: (selected.append(len(indices)), select(layer, indices)))
    for seed, policy in ((0, model), (1, wide), (2, eager), (3, model)):
        concatenating, roomy = concatenating_and_roomy(monkeypatch, policy, tokenizer, prompts, seed, **options)
        assert_same(concatenating, roomy)
        if "drop_finished_every" not in options:  # a fast path of its own: other draws than one call
            assert_same(plain_call(policy, tokenizer, prompts, seed, **options), roomy)  # the lesson's call
    if "drop_finished_every" in options and kv_cache.LAYERED_CACHE:
        assert selected, "no row was dropped: the drop path went untested"


def states(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@layered
def test_roomy_layer_writes_in_place_and_follows_crop_and_selection():
    layer = kv_cache.RoomyLayer(capacity=6)
    prompt_keys, prompt_values = states(3, 2, 4, 5, seed=0), states(3, 2, 4, 5, seed=1)
    keys, values = layer.update(prompt_keys, prompt_values)
    assert torch.equal(keys, prompt_keys) and torch.equal(values, prompt_values)
    buffer = layer.key_buffer.data_ptr()
    step_keys, step_values = states(3, 2, 1, 5, seed=2), states(3, 2, 1, 5, seed=3)
    keys, values = layer.update(step_keys, step_values)
    assert torch.equal(keys, torch.cat([prompt_keys, step_keys], dim=2))  # what DynamicLayer returns
    assert torch.equal(values, torch.cat([prompt_values, step_values], dim=2))
    assert layer.key_buffer.data_ptr() == buffer and layer.get_seq_length() == 5  # written in place
    layer.crop(-2)  # back to 3 positions: the next update writes over position 3
    keys, _ = layer.update(step_keys * 2, step_values * 2)
    assert torch.equal(keys, torch.cat([prompt_keys[:, :, :3], step_keys * 2], dim=2))
    assert layer.key_buffer.data_ptr() == buffer
    layer.batch_select_indices(torch.tensor([2, 0]))  # generate's drop of finished rows: a copy off the buffer
    assert layer.key_buffer is None and layer.value_buffer is None  # the old rows' memory goes, as DynamicCache's
    with pytest.raises(ValueError, match="do not match"):
        layer.update(step_keys[:1], step_values[:1])  # one row into a 2-row cache: refused, not broadcast
    keys, values = layer.update(step_keys[:2], step_values[:2])
    assert layer.key_buffer.data_ptr() != buffer and keys.shape == (2, 2, 5, 5)
    expected = torch.cat([prompt_keys[[2, 0], :, :3], 2 * step_keys[[2, 0]], step_keys[:2]], dim=2)
    assert torch.equal(keys, expected)
    for _ in range(2):  # past the capacity of 6: a larger buffer
        keys, _ = layer.update(step_keys[:2], step_values[:2])
    assert keys.shape[2] == 7 and torch.equal(keys[:, :, :5], expected)
    layer.reset()
    assert layer.get_seq_length() == 0 and layer.key_buffer is None


@layered
def test_roomy_cache_leaves_other_layer_kinds():
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    cache = DynamicCache()
    cache.update(states(1, 1, 3, 2, seed=0), states(1, 1, 3, 2, seed=1), 0)
    cache.layers.append(DynamicSlidingWindowLayer(sliding_window=4))
    kv_cache.roomy_cache(None, cache, capacity=8)
    assert type(cache.layers[0]) is kv_cache.RoomyLayer and cache.layers[0].get_seq_length() == 3
    assert type(cache.layers[1]) is DynamicSlidingWindowLayer
    offloaded = DynamicCache(offloading=True)  # its layers move to the CPU between uses: left as HF made them
    offloaded.layers.append(DynamicLayer())
    offloaded.layers[0].update(states(1, 1, 3, 2, seed=0), states(1, 1, 3, 2, seed=1))  # (a CUDA stream otherwise)
    assert type(kv_cache.roomy_cache(None, offloaded, capacity=8).layers[0]) is DynamicLayer


# --------------------------------------------------------------------------------------------------
# --fast-generate: the static cache and the compiled decode step
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def eager(monkeypatch, one_thread):
    """The static cache alone: no compile_config, so generate runs its forward eagerly (no compile on a CPU)."""
    monkeypatch.setattr(fast_generate, "compile_config", lambda device, mode=None: None)


@pytest.mark.parametrize("options", [dict(greedy=True), dict(), dict(rollout_batch=4), dict(temperature=0.7)])
def test_static_cache_from_the_shared_prefill_samples_alike(eager, options):
    tokenizer, model, prompts = tiny_setup()
    for seed in range(2):
        plain, fast = both_paths(model, tokenizer, prompts, seed, **options)
        assert_same(plain, fast)


@layered
def test_static_cache_length_is_bucketed_and_kept(eager):
    tokenizer, model, prompts = tiny_setup()
    both_paths(model, tokenizer, prompts, 0)
    both_paths(model, tokenizer, prompts[:1] * 3, 1)  # other prompt width, same rows: the same 64-long cache
    caches = model._fast_generate_caches
    assert len(caches) == 1 and next(iter(caches))[:2] == (12, kv_cache.CACHE_BUCKET)


def test_eos_rows_end_alike(eager):
    """A model that says EOS often: rows finish at different steps, padding after EOS, mask to the EOS."""
    tokenizer, model, prompts = tiny_setup()
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] *= 0  # (tied) a flat EOS logit: sampled now and then
    plain, fast = both_paths(model, tokenizer, prompts, 3)
    assert_same(plain, fast)
    lengths = fast.completion_mask.sum(1)
    assert (lengths < 8).any(), "no row stopped: the test would not test EOS handling"


def test_fast_generate_with_drop_finished_is_refused():
    with pytest.raises(ValueError, match="--fast-generate keeps every row"):
        Config(fast_generate=True, drop_finished_every=4).validate()
    with pytest.raises(ValueError, match="--no-fast turns every fast path off"):
        Config(fast=False, fast_generate=True).validate()
    tokenizer, model, prompts = tiny_setup()
    with pytest.raises(ValueError, match="static cache"):
        generate_rollouts(model, tokenizer, prompts, 2, max_new_tokens=4, fast_generate=True, drop_finished_every=2)


def test_compile_mode_follows_the_device():
    assert fast_generate.compile_mode("cuda") == "reduce-overhead" and fast_generate.compile_mode("cpu") == "default"
    config = fast_generate.compile_config("cpu")
    assert config._compile_all_devices and config.fullgraph and config.dynamic is False


def generates_compiled_call(monkeypatch):
    """--fast-generate as generate's compiled static-cache call (where the decode loop does not apply)."""
    monkeypatch.setattr(fast_loop, "decode_loop_refusal", lambda model, kwargs: "the test's refusal")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])  # on a CPU reduce-overhead compiles without graphs
def test_compiled_decode_step_samples_alike(one_thread, monkeypatch, mode):
    tokenizer, model, prompts = tiny_setup()
    generates_compiled_call(monkeypatch)
    monkeypatch.setattr(fast_generate, "compile_mode", lambda device: mode)
    for seed, options in ((0, dict(greedy=True)), (1, dict()), (2, dict(temperature=0.7))):
        plain, fast = both_paths(model, tokenizer, prompts, seed, **options)
        assert_same(plain, fast)
    assert getattr(model, "_compiled_call", None) is not None, "generate did not compile its decode step"
    assert model._last_compile_config.mode == mode


@pytest.mark.slow
def test_smollm2_roomy_cache_samples_alike(monkeypatch, one_thread):
    from harness.model import load_policy
    from rollout import render_prompts
    smollm2_or_skip()
    model, tokenizer = load_policy("smollm2")
    task = tasks.get_task("countdown")
    prompts = render_prompts(tokenizer, task, task.examples("train", 2, seed=0), "chat")
    for seed, options in ((0, dict(greedy=True)), (1, dict()), (2, dict(drop_finished_every=3))):
        concatenating, roomy = concatenating_and_roomy(monkeypatch, model, tokenizer, prompts, seed, **options)
        assert_same(concatenating, roomy)
        if "drop_finished_every" not in options:  # a fast path of its own: other draws than one call
            assert_same(plain_call(model, tokenizer, prompts, seed, **options), roomy)


# --------------------------------------------------------------------------------------------------
# The self-check at the first CUDA rollout, forced on this CPU
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def forced_check(monkeypatch, one_thread):
    """The check as on a CUDA device: fast/generate.py's untested_device says True."""
    monkeypatch.setattr(fast_generate, "untested_device", lambda model: True)


def check_sample(model, tokenizer, prompts):
    """What the fast path hands self_check: two greedy rows of the first prompt, either way."""
    from rollout import left_pad, plain_generate
    model.eval()
    ids, mask = left_pad(prompts[:1], tokenizer.pad_token_id)
    return fast_generate.check_sample(model, plain_generate, ids, mask, True, pad_id=tokenizer.pad_token_id,
                                      eos_id=tokenizer.eos_token_id)


def forgetful_cache(model, prefilled, capacity):
    """An injected bug in the roomy cache: the prompt's keys and values lost (noise in their place)."""
    pairs = [(layer.keys, layer.values) for layer in prefilled.layers] if hasattr(prefilled, "layers") else \
        zip(prefilled.key_cache, prefilled.value_cache)  # before the layered cache
    for keys, values in pairs:
        keys.copy_(states(*keys.shape, seed=0) * 10)
        values.copy_(states(*values.shape, seed=1) * 10)
    return prefilled


def test_self_check_called_directly_says_match_and_keeps_its_verdict(forced_check):
    tokenizer, model, prompts = tiny_setup()
    lines = []
    assert fast_generate.self_check(model, check_sample(model, tokenizer, prompts), False, log=lines.append)
    assert len(lines) == 1 and "match plain generate" in lines[0] and "2 rows x 4 greedy tokens" in lines[0]
    assert fast_generate.self_check(model, None, False, log=lines.append) and len(lines) == 1  # once a model


def test_self_check_runs_at_the_first_rollout_and_changes_nothing_when_the_paths_agree(forced_check, capsys):
    tokenizer, model, prompts = tiny_setup()
    torch.manual_seed(0)
    checked = generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8)
    assert model._fast_self_check == {False: True} and "match plain generate" in capsys.readouterr().out
    assert_same(plain_call(model, tokenizer, prompts, 0), checked)  # the greedy check draws no random numbers


def test_a_difference_is_one_line_and_the_plain_call_from_then_on(forced_check, monkeypatch, capsys):
    tokenizer, model, prompts = tiny_setup()
    monkeypatch.setattr(kv_cache, "roomy_cache", forgetful_cache)
    lines = []
    assert not fast_generate.self_check(model, check_sample(model, tokenizer, prompts), False, log=lines.append)
    assert len(lines) == 1 and "DIFFER from plain generate" in lines[0] and "plain call" in lines[0]
    model.__dict__.pop("_fast_self_check")
    torch.manual_seed(0)
    checked = generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8)  # the check, then plain
    output = capsys.readouterr().out
    assert output.count("\n") == 1 and "DIFFER" in output
    assert_same(plain_call(model, tokenizer, prompts, 0), checked)
    monkeypatch.setattr(fast_generate, "generate_options",
                        lambda *args: pytest.fail("a fast path ran after the fallback"))
    generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8)
    assert capsys.readouterr().out == ""  # checked once


def near_ties(model, runner_up=3):
    """The model's head puts one token's logit a hair (0.1 %) below the top one at every position: a near tie, as a
    random model has many (top-2 gap down to 0.0045)."""
    def tie(module, inputs, logits):
        logits = logits.float()
        top = logits.max(dim=-1).values
        logits[..., runner_up] = top - 1e-3 * top.abs()
        return logits
    return model.lm_head.register_forward_hook(tie)


def other_kernel_rounding(module, inputs, logits):
    """Another kernel path's rounding at the compute precision: the top logit a unit of it down, the rest one up."""
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else logits.dtype
    down = logits == logits.max(dim=-1, keepdim=True).values
    return logits + logits.abs() * torch.finfo(dtype).eps * torch.where(down, -1.0, 1.0)


def test_the_self_check_does_not_refuse_on_a_rounding_of_a_near_tie(forced_check, monkeypatch, capsys):
    """Under bf16 autocast a near tie flips between two kernel paths that round differently (the control below): the
    check runs with autocast off, where it tests positions, cache and masks, and says match."""
    tokenizer, model, prompts = tiny_setup()
    near_ties(model)
    fast = fast_generate.fast_generate

    def rounding_otherwise(*args, **kwargs):
        hook = model.lm_head.register_forward_hook(other_kernel_rounding)
        try:
            return fast(*args, **kwargs)
        finally:
            hook.remove()
    monkeypatch.setattr(fast_generate, "fast_generate", rounding_otherwise)
    sample = check_sample(model, tokenizer, prompts)
    flipped = under_bf16(lambda: [sample(fast=fast, compiled=False, max_new_tokens=4)[2] for fast in (False, True)])
    assert not torch.equal(*flipped), "the control: no flip under bf16, the test would not test the check"
    torch.manual_seed(0)
    checked = under_bf16(generate_rollouts, model, tokenizer, prompts, 4, max_new_tokens=8)
    assert model._fast_self_check == {False: True} and "match plain generate" in capsys.readouterr().out
    assert_same(under_bf16(plain_call, model, tokenizer, prompts, 0), checked)


# --------------------------------------------------------------------------------------------------
# Under the run's precision: bf16 autocast over fp32 weights, as every CUDA run with bf16 computes
# --------------------------------------------------------------------------------------------------
def under_bf16(function, *args, **options):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return function(*args, **options)


@pytest.mark.parametrize("options", [dict(greedy=True), dict(), dict(share_prefill=False), dict(rollout_batch=4)])
def test_every_fast_path_under_bf16_autocast_samples_alike(monkeypatch, one_thread, options):
    """The roomy cache with and without the shared prefill, and the (uncompiled) static cache, under bf16 autocast:
    token for token the plain call's completions, under the same seed."""
    tokenizer, model, prompts = tiny_setup()
    monkeypatch.setattr(fast_generate, "compile_config", lambda device, mode=None: None)
    for seed in range(2):
        plain = under_bf16(plain_call, model, tokenizer, prompts, seed, **options)
        torch.manual_seed(seed)
        roomy = under_bf16(generate_rollouts, model, tokenizer, prompts, 4, max_new_tokens=8, **options)
        torch.manual_seed(seed)
        static = under_bf16(generate_rollouts, model, tokenizer, prompts, 4, max_new_tokens=8, fast_generate=True,
                            **options)
        assert_same(plain, roomy)
        assert_same(plain, static)


@layered
def test_static_cache_is_kept_in_the_compute_dtype(eager):
    """Under bf16 autocast over fp32 weights HF's cache holds the keys in fp32 (RoPE in fp32), which attention casts
    to bf16 at every step: the static cache holds that cast, bf16 keys and values (token for token the plain call's
    completions: test_every_fast_path_under_bf16_autocast_samples_alike); without autocast, fp32. One cache is kept:
    a call under autocast replaces the one made without it, never writes into it."""
    tokenizer, model, prompts = tiny_setup()
    generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8, fast_generate=True, greedy=True)  # fp32
    (fp32_cache,) = model._fast_generate_caches.values()
    assert {fp32_cache.layers[0].keys.dtype, fp32_cache.layers[0].values.dtype} == {torch.float32}
    under_bf16(generate_rollouts, model, tokenizer, prompts, 4, max_new_tokens=8, fast_generate=True, greedy=True)
    (bf16_cache,) = model._fast_generate_caches.values()
    ids = torch.tensor([prompts[0]])
    dynamic = getattr(under_bf16(model, input_ids=ids, use_cache=True), kv_cache.cache_name(model))
    assert dynamic.layers[0].keys.dtype == torch.float32
    static = under_bf16(kv_cache.static_cache, model, dynamic, 1, ids.shape[1] + 1, 4).layers[0]
    assert (static.keys.dtype, static.values.dtype) == (torch.bfloat16, torch.bfloat16)
    assert torch.equal(static.keys[:, :, :ids.shape[1]], dynamic.layers[0].keys.to(torch.bfloat16))


@layered
def test_static_cache_types_its_values_where_transformers_allocated_them_as_its_keys(eager, monkeypatch):
    """transformers 5.17's StaticLayer (the first GPU run's) allocated values in the keys' dtype; emulated here: the
    static cache still takes bf16 values, token for token the plain call's completions."""
    from transformers.cache_utils import StaticLayer
    allocate = StaticLayer.lazy_initialization

    def values_as_keys(self, key_states, *rest):
        allocate(self, key_states, *((key_states,) if rest else ()))
    monkeypatch.setattr(StaticLayer, "lazy_initialization", values_as_keys)
    tokenizer, model, prompts = tiny_setup()
    plain = under_bf16(plain_call, model, tokenizer, prompts, 0, greedy=True)
    torch.manual_seed(0)
    static = under_bf16(generate_rollouts, model, tokenizer, prompts, 4, max_new_tokens=8, fast_generate=True,
                        greedy=True)
    assert_same(plain, static)


@pytest.mark.slow
def test_compiled_decode_step_under_bf16_autocast_samples_alike(one_thread, monkeypatch):
    tokenizer, model, prompts = tiny_setup()
    generates_compiled_call(monkeypatch)
    for seed, options in ((0, dict(greedy=True)), (1, dict())):
        plain = under_bf16(plain_call, model, tokenizer, prompts, seed, **options)
        torch.manual_seed(seed)
        fast = under_bf16(generate_rollouts, model, tokenizer, prompts, 4, max_new_tokens=8, fast_generate=True,
                          **options)
        assert_same(plain, fast)
    assert getattr(model, "_compiled_call", None) is not None, "generate did not compile its decode step"


def test_a_fast_path_that_raises_is_a_failed_verdict_in_one_line(forced_check, monkeypatch, capsys):
    """An exception of a fast path (the first CUDA run's index_copy_) is the check's verdict: one line, then the plain
    call, the same completions as --no-fast."""
    tokenizer, model, prompts = tiny_setup()

    def broken(*args, **kwargs):
        raise RuntimeError("index_copy_(): self and source expected to have the same dtype\nsecond line")
    monkeypatch.setattr(kv_cache, "roomy_cache", broken)
    torch.manual_seed(0)
    checked = generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8)
    output = capsys.readouterr().out
    assert output.count("\n") == 1 and "FAILED on this device (RuntimeError: index_copy_()" in output
    assert "second line" not in output and model._fast_self_check == {False: False}
    assert_same(plain_call(model, tokenizer, prompts, 0), checked)


def test_a_bug_in_the_plain_call_keeps_its_traceback(forced_check, monkeypatch):
    import rollout
    tokenizer, model, prompts = tiny_setup()

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in the plain path")
    monkeypatch.setattr(rollout, "plain_generate", broken)
    with pytest.raises(ZeroDivisionError, match="a bug in the plain path"):
        generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8)


def test_sampling_sorts_the_vocabulary_only_for_top_p(one_thread):
    """Issue 63: with top-p and top-k off a sampled token costs a softmax and one multinomial draw, no full-vocab
    sort (HF adds its top-p warper, which sorts, only for top_p < 1; top_k=0 adds none). Ops seen by a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))
    tokenizer, model, prompts = tiny_setup()
    seen = {}
    for top_p in (1.0, 0.9):
        with Ops() as ops:
            generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=4, top_p=top_p)
        seen[top_p] = {name for name in ops.names if name in ("aten.sort", "aten.topk", "aten.multinomial")}
    assert seen == {1.0: {"aten.multinomial"}, 0.9: {"aten.multinomial", "aten.sort"}}


@layered
def test_the_roomy_cache_is_the_default_only_where_it_was_measured_faster():
    """On a CPU the roomy cache; on another device (CUDA: a meta model stands in) HF's own cache, which generate makes
    (an H200 step was 15% faster with it: fast/generate.py's ROOMY_CACHE_DEVICES)."""
    tokenizer, model, prompts = tiny_setup()
    name = kv_cache.cache_name(model)
    on_cpu = fast_generate.generate_options(model, None, 2, 5, 8, compiled=False)[name]
    assert any(type(layer) is kv_cache.RoomyLayer for layer in on_cpu.layers)
    assert fast_generate.generate_options(model.to("meta"), None, 2, 5, 8, compiled=False)[name] is None
