"""fast/ (--fast-generate): the decode loop (one step with generate's sampling inside, the stop check every k tokens)
on its static cache gives the same completions as rollout.py's plain generate call, greedy and sampled token for token
under the same seed, fp32 and under bf16 autocast, rows ending at EOS inside a stop-check block (the random numbers
after the call are the plain call's), its CUDA-graph branch run on this CPU with torch.cuda's graph API stood in; the
cache kept in the compute dtype, per row count; where the loop does not apply, the plain call; the self-check of the
first CUDA rollouts (forced here): graphs against eager steps, one line and the plain call on a difference."""
import contextlib

import pytest
import torch
from transformers import LlamaForCausalLM

import tasks
from fast import decode_loop as fast_loop, generate as fast_generate, kv_cache
from harness.tiny import build_char_tokenizer, build_tiny_model
from tests.stubs import generate_rollouts, smollm2_or_skip

# transformers before the layered cache API (the floor of requirements.txt): --fast-generate is the plain call
layered = pytest.mark.skipif(not kv_cache.LAYERED_CACHE, reason="no layered cache API in this transformers")


def tiny_setup():
    """A 1-layer, 32-wide tiny Llama at init, three prompts of different lengths (left padding)."""
    tokenizer = build_char_tokenizer(tasks.COMPACT_ALPHABET)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    prompts = [tokenizer(text)["input_ids"] for text in ("12 5>7:", "3>9:", "45 6 7>1:")]
    return tokenizer, model, prompts


def both_paths(model, tokenizer, prompts, seed, **options):
    """(plain, loop) Rollouts of the same prompts under the same seed."""
    return [plain_call(model, tokenizer, prompts, seed, fast_generate=fast, **options) for fast in (False, True)]


def assert_same(plain, fast):
    for field in ("input_ids", "attention_mask", "completion_mask", "truncated"):
        assert torch.equal(getattr(plain, field), getattr(fast, field)), field
    assert plain.completions == fast.completions


def plain_call(model, tokenizer, prompts, seed, **options):
    """The Rollouts of 4 completions a prompt, 8 new tokens, under the seed (rollout.py's plain generate call unless
    options say fast_generate=True)."""
    torch.manual_seed(seed)
    return generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8, **options)


@pytest.fixture
def forced_check(monkeypatch, one_thread):
    """The self-check as on a CUDA device: fast/generate.py's untested_device says True."""
    monkeypatch.setattr(fast_generate, "untested_device", lambda device: True)


def under_bf16(function, *args, **options):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return function(*args, **options)


@pytest.mark.slow
def test_smollm2_greedy_and_seeded_samples_token_for_token(loop_calls):
    """--fast-generate's decode loop on SmolLM2-135M: token for token the plain call's completions."""
    from harness.model import load_policy
    smollm2_or_skip()
    model, tokenizer = load_policy("smollm2")
    task = tasks.get_task("countdown")
    from rollout import render_prompts
    prompts = render_prompts(tokenizer, task, task.examples("train", 2, seed=0), "chat")
    for seed, options in ((0, dict(greedy=True)), (1, dict())):
        plain, fast = both_paths(model, tokenizer, prompts, seed, **options)
        assert_same(plain, fast)
    assert loop_calls


@pytest.fixture
def loop_calls(monkeypatch, one_thread):
    """Counts the decode loop's calls (so that a test sees it ran, not generate's compiled call)."""
    calls = []
    loop = fast_loop.decode_loop
    monkeypatch.setattr(fast_loop, "decode_loop", lambda *args, **kwargs: (calls.append(kwargs),
                                                                                loop(*args, **kwargs))[1])
    return calls


def eos_often(model, tokenizer):
    """The tiny model with a flat EOS logit (its tied row zeroed): sampled now and then."""
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] *= 0
    return model


@layered
@pytest.mark.parametrize("options", [dict(greedy=True), dict(), dict(temperature=0.7), dict(top_p=0.8),
                                     dict(rollout_batch=4)])
@pytest.mark.parametrize("every", [1, 3, 8])
def test_decode_loop_samples_alike(loop_calls, monkeypatch, options, every):
    """Token for token the plain generate call's completions under the same seed, for any stop-check interval, and
    the random numbers after the call are the plain call's too (the next rollout draws the same)."""
    tokenizer, model, prompts = tiny_setup()
    eos_often(model, tokenizer)
    monkeypatch.setattr(fast_loop, "STOP_CHECK_EVERY", every)
    for seed in range(3):
        plain, fast = both_paths(model, tokenizer, prompts, seed, **options)
        after_fast = torch.rand(4)
        plain_call(model, tokenizer, prompts, seed, **options)
        assert_same(plain, fast)
        assert torch.equal(torch.rand(4), after_fast)
    assert loop_calls and all(call["stop_check_every"] == every for call in loop_calls)


@layered
@pytest.mark.parametrize("bf16", [False, True])
def test_decode_loop_stops_where_generate_stops(loop_calls, bf16):
    """Every row ends at an EOS before max_new_tokens: generate stops at the last one; the loop, which looks every 8
    steps, runs past it, cuts its columns and undoes its draws. Same ids, same width, same random numbers after (the
    loop's redraw patched out, the numbers after differ: the check can fail)."""
    tokenizer, model, prompts = tiny_setup()
    eos_often(model, tokenizer)
    run = under_bf16 if bf16 else (lambda function, *args, **options: function(*args, **options))
    widths = []
    for seed in range(12):
        results = []
        for fast in (False, True):
            torch.manual_seed(seed)
            rollouts = run(generate_rollouts, model, tokenizer, prompts[:1], 2, max_new_tokens=48,
                           fast_generate=fast)
            results.append((rollouts, torch.rand(4)))
        (plain, plain_after), (fast, fast_after) = results
        assert_same(plain, fast)
        assert torch.equal(plain_after, fast_after)
        widths.append(fast.completion_mask.shape[1])
    assert any(width < 48 and width % fast_loop.STOP_CHECK_EVERY for width in widths), \
        f"no call ended inside a block of the stop check: {widths}"


@layered
def test_decode_loop_without_its_redraw_leaves_other_random_numbers(loop_calls, monkeypatch):
    """The check above can fail: with the extra steps' draws kept, the random numbers after the call differ."""
    tokenizer, model, prompts = tiny_setup()
    eos_often(model, tokenizer)
    monkeypatch.setattr(fast_loop, "redraw", lambda *args: None)
    differ = []
    for seed in range(12):
        after = []
        for fast in (False, True):
            torch.manual_seed(seed)
            rollouts = generate_rollouts(model, tokenizer, prompts[:1], 2, max_new_tokens=48, fast_generate=fast)
            after.append(torch.rand(4))
        differ.append(rollouts.completion_mask.shape[1] < 48 and not torch.equal(*after))
    assert any(differ)


@layered
def test_decode_loop_reads_the_device_once_every_k_steps(loop_calls, monkeypatch):
    """The loop's host reads: one per STOP_CHECK_EVERY steps (counted as a dispatch mode sees them: the
    _local_scalar_dense of int(tensor)), no multinomial (its host-side checks), no nonzero."""
    from benchmarks.decode_ops import OpCounter
    tokenizer, model, prompts = tiny_setup()
    steps, counters = [], []
    step, loop = fast_loop.decode_step, fast_loop.decode_loop

    def counted_step(*args, **kwargs):
        run, state = step(*args, **kwargs)
        return (lambda: (steps.append(1), run())[1]), state

    def counted_loop(*args, **kwargs):
        with OpCounter() as counter:
            counters.append(counter)
            return loop(*args, **kwargs)
    monkeypatch.setattr(fast_loop, "decode_step", counted_step)
    monkeypatch.setattr(fast_loop, "decode_loop", counted_loop)
    for every in (1, 4, 16):
        monkeypatch.setattr(fast_loop, "STOP_CHECK_EVERY", every)
        steps.clear(), counters.clear()
        generate_rollouts(model, tokenizer, prompts, 2, max_new_tokens=16, fast_generate=True)
        assert len(steps) == 16 and counters[0].syncs == 16 // every, (every, counters[0].syncs)
        assert counters[0].names.isdisjoint({"aten.multinomial", "aten.nonzero", "aten.item"})


@layered
def test_decode_loop_token_sampler_draws_as_multinomial():
    """One draw of torch.multinomial(p, 1) is argmax(p / E), E exponential noise from the same generator: the same
    tokens and the same generator state after, for any p (here with a zero entry, as top-p leaves)."""
    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    probs[:, 7] = 0
    for seed in range(5):
        torch.manual_seed(seed)
        expected = torch.multinomial(probs, num_samples=1).squeeze(1)
        after = torch.rand(3)
        torch.manual_seed(seed)
        drawn = fast_loop.token_sampler(dict(do_sample=True))(probs.log())
        assert torch.equal(drawn, expected) and torch.equal(torch.rand(3), after)


def test_decode_loop_applies_only_where_it_matches_generate():
    tokenizer, model, _ = tiny_setup()
    sampling = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
    if not kv_cache.LAYERED_CACHE:
        assert "layered cache" in fast_loop.decode_loop_refusal(model, sampling)
        return
    assert fast_loop.decode_loop_refusal(model, sampling) is None
    assert "beyond" in fast_loop.decode_loop_refusal(model, dict(sampling, repetition_penalty=1.1))
    assert "beyond" in fast_loop.decode_loop_refusal(model, dict(sampling, min_p=0.1))
    model.config._attn_implementation = "flash_attention_2"
    assert "attention" in fast_loop.decode_loop_refusal(model, sampling)


@layered
def test_where_the_loop_does_not_apply_the_plain_call_runs_and_says_so_once(loop_calls, monkeypatch, capsys):
    tokenizer, model, prompts = tiny_setup()
    monkeypatch.setattr(fast_loop, "decode_loop_refusal", lambda model, kwargs: "attention 'flash_attention_2'")
    for seed in range(2):
        plain = plain_call(model, tokenizer, prompts, seed)
        assert_same(plain, plain_call(model, tokenizer, prompts, seed, fast_generate=True))
    assert not loop_calls
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("--fast-generate: attention") and "plain call" in lines[0]


class StandInCuda:
    """torch.cuda's graph API as cuda_graph uses it, on a CPU: records the calls; a capture runs nothing (the step
    is kept and run at each replay, as a graph replays its kernels)."""

    def __init__(self):
        self.events, self.capturing = [], False
        cuda = self

        class Stream:
            def __init__(self, device):
                cuda.events.append(("Stream", str(device)))

            def wait_stream(self, other):
                cuda.events.append(("wait_stream", type(other).__name__))

        class CUDAGraph:
            def replay(self):
                cuda.events.append("replay")
                self.step()

            def pool(self):
                return id(self)
        self.Stream, self.CUDAGraph = Stream, CUDAGraph

    def current_stream(self, device):
        return self.Stream(device)

    @contextlib.contextmanager
    def stream(self, stream):
        self.events.append("on side stream")
        yield
        self.events.append("off side stream")

    @contextlib.contextmanager
    def graph(self, graph, pool=None):
        self.events.append(("capture", "shared pool" if pool else "own pool"))
        self.capturing, self.graph_object = True, graph
        yield
        self.capturing = False
        self.events.append("captured")


def test_cuda_graph_warms_up_on_a_side_stream_then_captures_and_replays():
    """One eager run on a side stream, then two captures in one pool: the graph of a call's first step (it casts the
    weights under autocast) and the graph of every next step."""
    cuda = StandInCuda()
    runs = []

    def step():
        if cuda.capturing:  # what a capture records: the stand-in keeps the step for its replays
            name = "first" if cuda.events[-1] == ("capture", "own pool") else "next"
            cuda.graph_object.step = lambda: runs.append(name)
            return
        runs.append("eager")
    first, then = fast_loop.cuda_graph(step, torch.device("cpu"), cuda=cuda)
    assert runs == ["eager"]
    assert cuda.events == [("Stream", "cpu"), ("Stream", "cpu"), ("wait_stream", "Stream"), "on side stream",
                           "off side stream", ("Stream", "cpu"), ("wait_stream", "Stream"), ("capture", "own pool"),
                           "captured", ("capture", "shared pool"), "captured"]
    first(), then(), then()
    assert runs == ["eager", "first", "next", "next"] and cuda.events[-3:] == ["replay"] * 3


def graphs_stood_in(monkeypatch):
    """decode_loop's CUDA branch on this CPU: torch.cuda's graph API stood in (a replay runs the captured step)."""
    cuda = StandInCuda()
    graph = fast_loop.cuda_graph

    def capture(step, device):
        def recording_step():
            if cuda.capturing:
                cuda.graph_object.step = step
            else:
                step()
        return graph(recording_step, device, cuda=cuda)
    monkeypatch.setattr(fast_loop, "graphs_on", lambda device: True)
    monkeypatch.setattr(fast_loop, "cuda_graph", capture)
    return cuda


@layered
def test_decode_loop_captures_once_per_shape_and_replays_across_calls(loop_calls, monkeypatch):
    """The CUDA branch of decode_loop on a CPU: the shape's first step eager (the warm-up), then captured; every call
    after replays the same graphs, its first step through the graph that casts the weights. The same tokens as the
    plain call, sampled and at EOS; calls alternating between two row counts capture once each (KEPT_SHAPES)."""
    tokenizer, model, prompts = tiny_setup()
    eos_often(model, tokenizer)
    cuda = graphs_stood_in(monkeypatch)
    for seed in range(3):
        cuda.events.clear()
        assert_same(*both_paths(model, tokenizer, prompts, seed))
        # max_new_tokens 8, one block of STOP_CHECK_EVERY = 8 steps: the first call's first step eager, then
        # captured; each next call replays its 8 steps
        captures = [event for event in cuda.events if event[0] == "capture"]
        assert (len(captures), cuda.events.count("replay")) == ((2, 7) if seed == 0 else (0, 8))
    for seed, rows in ((0, 8), (1, 12), (2, 8), (3, 12)):  # 2 prompts (8 rows), then 3: alternating shapes
        cuda.events.clear()
        assert_same(*both_paths(model, tokenizer, prompts[:rows // 4], seed))
        assert sum(event[0] == "capture" for event in cuda.events) == (2 if seed == 0 else 0), seed
    assert [rows for rows, _ in model._fast_generate_caches] == [8, 12]  # the most recent last


@layered
def test_the_self_check_compares_graphs_with_eager_steps_on_the_first_two_rollouts(forced_check, monkeypatch,
                                                                                     capsys):
    """On a CUDA device (forced) the first call and the first after the weights moved also run eager steps from the
    same random state: a match is
    one line each and changes nothing (the plain call's tokens, the random numbers after it); a graph whose tokens
    differ (a stand-in replay that writes EOS) is one line, and the plain call from then on."""
    tokenizer, model, prompts = tiny_setup()
    cuda = graphs_stood_in(monkeypatch)
    for seed in range(4):  # the second call at the same weights is not checked; the third, after a "step", is
        if seed == 2:
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)
        plain = plain_call(model, tokenizer, prompts, seed)
        after = torch.rand(3)
        assert_same(plain, plain_call(model, tokenizer, prompts, seed, fast_generate=True))
        assert torch.equal(torch.rand(3), after)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("the CUDA graphs give the eager steps' tokens" in line for line in lines), lines
    for kept in ("_fast_generate", "_fast_generate_caches"):  # a new run, with graphs that write EOS at each replay
        model.__dict__.pop(kept)
    replay = cuda.CUDAGraph.replay

    def wrong_replay(graph):
        replay(graph)
        model._fast_generate_caches[(12, torch.float32)].decode_loop["state"]["completion"][:, 0] = \
            tokenizer.eos_token_id
    monkeypatch.setattr(cuda.CUDAGraph, "replay", wrong_replay)
    for seed in range(2):
        assert_same(plain_call(model, tokenizer, prompts, seed), plain_call(model, tokenizer, prompts, seed,
                                                                            fast_generate=True))
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("--fast-generate (12 rows) FAILED on this device (RuntimeError: the CUDA graphs' tokens "
                           "differ from eager steps' in") and "_fast_generate_caches" not in model.__dict__


@layered
def test_a_capture_that_fails_at_the_real_batch_is_one_line_and_the_plain_call(forced_check, monkeypatch, capsys):
    """A capture that fails (as an out-of-memory inside a capture would): one FAILED line, the static cache freed, the
    plain call's completions, and the plain call from then on."""
    tokenizer, model, prompts = tiny_setup()
    graphs_stood_in(monkeypatch)

    def fails(step, device):
        raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB\nsecond line")
    monkeypatch.setattr(fast_loop, "cuda_graph", fails)
    checked = plain_call(model, tokenizer, prompts, 0, fast_generate=True)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("--fast-generate (12 rows) FAILED on this device (RuntimeError: CUDA out of memory.")
    assert_same(plain_call(model, tokenizer, prompts, 0), checked)
    assert "_fast_generate_caches" not in model.__dict__  # its static cache freed
    monkeypatch.setattr(fast_loop, "decode_loop", lambda *args, **kwargs: pytest.fail("the loop ran after the fall"))
    assert_same(plain_call(model, tokenizer, prompts, 1), plain_call(model, tokenizer, prompts, 1, fast_generate=True))
    assert capsys.readouterr().out == ""


@layered
def test_static_cache_is_kept_in_the_compute_dtype_and_bucketed():
    """Under bf16 autocast over fp32 weights HF's cache holds the keys in fp32 (RoPE in fp32), which attention casts
    to bf16 at every step: the static cache holds that cast, bf16 keys and values; without autocast, fp32. Its length
    is the prompt and new tokens rounded up to CACHE_BUCKET, kept for a later, shorter call of as many rows."""
    tokenizer, model, prompts = tiny_setup()
    ids = torch.tensor([prompts[0]])
    dynamic = getattr(under_bf16(model, input_ids=ids, use_cache=True), kv_cache.cache_name(model))
    assert dynamic.layers[0].keys.dtype == torch.float32
    static = under_bf16(kv_cache.static_cache, model, dynamic, 1, ids.shape[1] + 1, 4).layers[0]
    assert (static.keys.dtype, static.values.dtype) == (torch.bfloat16, torch.bfloat16)
    assert torch.equal(static.keys[:, :, :ids.shape[1]], dynamic.layers[0].keys.to(torch.bfloat16))
    assert static.max_cache_len == kv_cache.CACHE_BUCKET
    fp32 = kv_cache.static_cache(model, None, 1, 70, 4)  # another dtype: another cache, 128 long
    assert fp32.layers[0].max_cache_len == 128 and kv_cache.static_cache(model, None, 1, 5, 4) is fp32


@layered
def test_decode_loop_ends_at_a_block_boundary_without_another_block(monkeypatch, one_thread):
    """Every row writes its EOS at step 8, the last of the first stop-check block: the check there ends the loop
    (before: one more block of 8 pad steps ran before a check noticed)."""
    tokenizer, model, prompts = tiny_setup()
    steps = []

    def eos_at_step_8(generate_kwargs):
        def sample(scores):
            steps.append(1)
            return torch.full(scores.shape[:1], tokenizer.eos_token_id if len(steps) == 8 else 5)
        return sample
    monkeypatch.setattr(fast_loop, "token_sampler", eos_at_step_8)
    rollouts = generate_rollouts(model, tokenizer, prompts, 2, max_new_tokens=24, fast_generate=True, greedy=True)
    assert len(steps) == 8 and rollouts.completion_mask.shape[1] == 8


@layered
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_decode_loop_with_grouped_query_attention_fp32_and_bf16(loop_calls, attention):
    """Three layers, 4 query heads on 2 KV heads; SDPA takes the loop's boolean 4D mask, eager attention its additive
    one: token for token the plain call, fp32 and under bf16 autocast."""
    tokenizer, _, prompts = tiny_setup()
    config = build_tiny_model(tokenizer, hidden_size=64, num_layers=3, num_heads=4).config
    config.num_key_value_heads = 2
    torch.manual_seed(1)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = attention
    for seed, options in ((0, dict(greedy=True)), (1, dict()), (2, dict(temperature=0.7))):
        assert_same(*both_paths(model, tokenizer, prompts, seed, **options))
        plain = under_bf16(plain_call, model, tokenizer, prompts, seed, **options)
        torch.manual_seed(seed)
        assert_same(plain, under_bf16(generate_rollouts, model, tokenizer, prompts, 4, max_new_tokens=8,
                                      fast_generate=True, **options))
    assert len(loop_calls) == 6


@layered
def test_decode_step_writes_no_copy_of_the_cache():
    """At Qwen2.5-0.5B's attention (14 query heads on 2 KV heads), 8 rows, cache 320, bf16 autocast: a step's attention
    writes less per layer than one bf16 copy of the layer's keys (8 x 2 x 320 x 64 x 2 bytes), under any supported
    transformers (before: 5.17's repeat_kv wrote the cache x7 in fp32, then in bf16; 5.25 a bf16 cast of the keys)."""
    from benchmarks.decode_ops import skinny_model, step_counts
    _, written = step_counts(skinny_model(1, hidden=896), 8, 320)
    assert written < 8 * 2 * 320 * 64 * 2, written
