"""The fast paths of rollout.sample_completions' generate call: the same completions, less time
per token (the shared prefill, the roomy cache, finished rows dropped, opt-in a static-cache decode
loop), and the self-check that holds them to the plain call on a device where they never ran.

On (`--no-fast` turns it off): on a CPU the roomy cache (fast/kv_cache.py), DynamicCache's values
written in place instead of concatenated, in the same generate call (ROOMY_CACHE_DEVICES: where
it was measured faster; on CUDA HF's own cache).

Opt-in (`--fast-generate`): the plain generate runs in eager mode: every decode step runs the
model's Python forward op by op, then generate's own ops (logits processors, the stop criteria,
a concatenation) and a blocking read of "every row finished?". On a GPU that step is bound by
Python and kernel launches (~900 dispatched ops per token at Qwen2.5-0.5B's shape:
benchmarks/decode_ops.py), far from what the weights' bytes and the FLOPs allow
(benchmarks/floor.py). The option runs the decode loop (decode_loop):

  1. a static KV cache (fast/kv_cache.py's static_cache: fixed-size tensors, written in place)
     holding the shared prefill: each prompt is still run through the model once and its keys
     and values copied into its M rows;
  2. one decode step (decode_step) that does what an iteration of generate's sampling loop does
     (forward, generate's warpers, the draw, pad after EOS, the stop criteria) on tensors written
     in place, with no host sync: on CUDA its first run is eager and it is then captured as one
     CUDA graph (cuda_graph), one host call per token; elsewhere it runs eagerly;
  3. the stop check ("has every row finished?", the one blocking read) every STOP_CHECK_EVERY
     tokens; the steps past the last row's EOS are cut and their random draws undone.

The samples are the same: the step draws the same random numbers as generate's torch.multinomial
(token_sampler) and picks the same token; only the forward's rounding can differ (a static cache
is read to its full length, masked) (tests/test_fast_generate.py: greedy and seeded samples token
for token, fp32 and bf16 autocast, rows ending at EOS). Where the loop does not apply
(decode_loop_refusal: another attention, other sampling settings), or with decode_loop=False,
--fast-generate is generate's own call on the static cache with transformers' compile_config
(torch.compile of the forward; on CUDA mode "reduce-overhead"). Costs: the cache length is rounded
up to CACHE_BUCKET (kept per shape, reused), a static cache is read to its full length at every
step (masked), it cannot drop finished rows (config refuses --fast-generate with
--drop-finished-every), and it stays allocated on the model between steps (peak memory grows by
rows x cache length x the KV bytes of a position). Numbers: benchmarks/decode_ops.py,
benchmarks/rollout_time.py, docs/performance.md. Without transformers' layered cache API
(fast/kv_cache.py's LAYERED_CACHE) --fast-generate is the plain call's cache.

The self-check (self_check): these paths are tested token for token on this project's CPUs only.
At the first rollout on a CUDA device, a few greedy tokens of two rows are generated both ways
(with --fast-generate: through the decode loop and its CUDA graph); on any difference, or an
exception raised by a fast path, the run says so in one line and generates with the plain call
from then on.
"""
import inspect
import warnings

import torch
from transformers import CompileConfig

from fast import kv_cache


# --------------------------------------------------------------------------------------------------
# The generate call's cache: roomy (on), static and compiled (--fast-generate)
# --------------------------------------------------------------------------------------------------
def generate_options(model, prefilled, rows, prompt_width, new_tokens, compiled):
    """The cache keyword argument of a generate call for `rows` rows of `prompt_width` columns and
    up to `new_tokens` more, holding `prefilled` (the shared prefill's DynamicCache, or None), plus
    the compile settings when `compiled`."""
    name = kv_cache.cache_name(model)
    if compiled and not kv_cache.LAYERED_CACHE:
        warnings.warn("--fast-generate needs transformers' layered cache API (tested from "
                      "4.57): generating with the plain call", stacklevel=2)
    device = next(model.parameters()).device
    if not (compiled and kv_cache.LAYERED_CACHE):
        cache = kv_cache.roomy_cache if device.type in ROOMY_CACHE_DEVICES \
            else kv_cache.concatenating_cache
        return {name: cache(model, prefilled, prompt_width + new_tokens)}
    return {name: kv_cache.static_cache(model, prefilled, rows, prompt_width, new_tokens),
            "compile_config": compile_config(device)}


# Where the roomy cache is the default: where it was measured faster than HF's concatenating
# DynamicCache. On CPUs (docs/performance.md: it removes a copy of the cache per token). On one H200
# it was slower: a Qwen2.5-0.5B-shaped step took 8.23 s with it and 7.34 s with HF's cache (rollout
# 6.10 against 5.30 s; one step each after a warm-up, the tree at 27cee0c,
# lab/logs/gpu-h200-27cee0c): a CUDA device takes HF's cache until a measurement says otherwise.
ROOMY_CACHE_DEVICES = ("cpu",)


def compile_mode(device):
    """CUDA graphs where there are CUDA devices; elsewhere inductor without graphs."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


def compile_config(device, mode=None):
    """transformers' CompileConfig for generate's decode step (fullgraph: a graph break would be a
    silent slowdown)."""
    config = CompileConfig(fullgraph=True, dynamic=False, mode=mode or compile_mode(device))
    config._compile_all_devices = True  # else transformers compiles on CUDA-like devices only
    return config


# --------------------------------------------------------------------------------------------------
# The self-check: the fast paths against the plain call, once, where they were never tested
# --------------------------------------------------------------------------------------------------
SELF_CHECK_TOKENS = 4  # greedy tokens a row: from the prefill on into the cached decoding


def untested_device(model):
    """True on a CUDA device: the fast paths' token identity is tested on CPUs only (bf16 flash or
    memory-efficient attention on the cache's strided views, CUDA graphs)."""
    return next(model.parameters()).device.type == "cuda"


def self_check(model, sample, compiled, log=print):
    """Whether the fast paths may run on this model: True on a tested device; else, once per model
    and `compiled`, whether a few greedy tokens come out the same both ways. On a difference, or an
    exception raised by a fast path, one line says so and the caller takes the plain path (an
    exception of the plain call is a bug to see: it propagates with its traceback).

    sample(fast=, compiled=, max_new_tokens=) -> (prompt ids, prompt mask, completion ids) of two
    rows, greedy (rollout.sample_completions with its other arguments bound)."""
    verdicts = model.__dict__.setdefault("_fast_self_check", {})
    if not untested_device(model) or compiled in verdicts:
        return verdicts.get(compiled, True)
    plain = sample(fast=False, compiled=False, max_new_tokens=SELF_CHECK_TOKENS)
    if compiled:
        paths = getattr(sample, "compiled_path", "the static cache and compiled generate")
    elif next(model.parameters()).device.type in ROOMY_CACHE_DEVICES:
        paths = "the roomy cache"
    else:
        paths = "the shared prefill into HF's cache"
    rows = f"{len(plain[2])} rows x {SELF_CHECK_TOKENS} greedy tokens"
    try:
        fast = sample(fast=True, compiled=compiled, max_new_tokens=SELF_CHECK_TOKENS)
    except Exception as error:  # noqa: BLE001 -- a fast path's failure is its verdict, one line
        verdicts[compiled] = False
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        log(f"fast-path self-check ({rows}): {paths} FAILED on this device "
            f"({type(error).__name__}: {first_line}): generating with the plain call for this run "
            "(--no-fast does so from the start)")
        return False
    verdicts[compiled] = all(torch.equal(a, b) for a, b in zip(plain, fast))
    log(f"fast-path self-check ({rows}): {paths} match plain generate" if verdicts[compiled] else
        f"fast-path self-check ({rows}): {paths} DIFFER from plain generate on this device: "
        "generating with the plain call for this run (--no-fast does so from the start)")
    return verdicts[compiled]


# --------------------------------------------------------------------------------------------------
# rollout.sample_completions' fast path: the shared prefill, the roomy or static cache, finished
# rows
# dropped every drop_finished_every tokens; the self-check first where the paths were never tested
# --------------------------------------------------------------------------------------------------
GREEDY = dict(do_sample=False, temperature=None, top_p=None, top_k=None, repetition_penalty=1.0)


def sample_completions(model, plain, prompt_input_ids, prompt_mask, num_generations, *,
                       max_new_tokens, pad_id, eos_id, generate_kwargs, share_prefill=True,
                       drop_finished_every=None, compiled=False, decode_loop=True,
                       stop_check_every=None):
    """rollout.sample_completions with fast=options: the same (prompt ids, prompt mask, completion
    ids) as the plain call `plain` (rollout.plain_generate), in less time; or None when the
    self-check refuses the fast paths on this device (the caller then runs its plain call).
    prompt_input_ids, prompt_mask [N, P], left-padded.

    share_prefill: each prompt runs through the model once, its KV cache copied to its M rows.
    drop_finished_every: generate that many tokens at a time, then take the rows that reached EOS
    (and their KV cache) out of the batch (the same distribution, other random draws than one
    call). compiled (--fast-generate): a static KV cache; with decode_loop, this file's decode
    loop (one step, a CUDA graph on CUDA; the stop check every stop_check_every tokens, None:
    STOP_CHECK_EVERY), else (or where the loop does not apply: decode_loop_refusal) generate's
    compiled decode step. On a device the paths were never tested on, self_check runs first.
    """
    if compiled and drop_finished_every:
        raise ValueError("fast generate keeps every row in its static cache: "
                         "no drop_finished_every")
    options = dict(pad_id=pad_id, eos_id=eos_id, decode_loop=decode_loop,
                   stop_check_every=stop_check_every)
    if not self_check(model, check_sample(model, plain, prompt_input_ids[:1], prompt_mask[:1],
                                          share_prefill, **options), compiled):
        return None
    return fast_generate(model, prompt_input_ids, prompt_mask, num_generations, **options,
                         max_new_tokens=max_new_tokens, generate_kwargs=generate_kwargs,
                         share_prefill=share_prefill, drop_finished_every=drop_finished_every,
                         compiled=compiled)


def check_sample(model, plain, prompt_input_ids, prompt_mask, share_prefill, *, pad_id, eos_id,
                 **options):
    """What self_check compares: sample(fast=, compiled=, max_new_tokens=) -> two greedy rows of
    the prompt. options: fast_generate's decode_loop, stop_check_every."""
    def sample(fast, compiled, max_new_tokens):
        call = dict(max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                    generate_kwargs=GREEDY)
        if fast:
            return fast_generate(model, prompt_input_ids, prompt_mask, 2, drop_finished_every=None,
                                 compiled=compiled, share_prefill=share_prefill, **call,
                                 **{k: v for k, v in options.items() if k != "max_new_tokens"})
        ids = prompt_input_ids.repeat_interleave(2, dim=0)
        mask = prompt_mask.repeat_interleave(2, dim=0)
        return ids, mask, plain(model, ids, mask, **call)
    loop = options.get("decode_loop", True) and decode_loop_refusal(model, GREEDY) is None
    graph = ", one CUDA graph a step" if prompt_input_ids.device.type == "cuda" else ""
    sample.compiled_path = f"the decode loop on the static cache{graph}" if loop \
        else "the static cache and compiled generate"  # self_check's words for --fast-generate
    return sample


def fast_generate(model, prompt_input_ids, prompt_mask, num_generations, *, max_new_tokens, pad_id,
                  eos_id, generate_kwargs, share_prefill, drop_finished_every, compiled,
                  decode_loop=True, stop_check_every=None):
    """The fast paths' (prompt ids, prompt mask, completion ids): --fast-generate's decode loop
    where it applies, else generate on the roomy (or static, compiled) cache."""
    if compiled and decode_loop and decode_loop_refusal(model, generate_kwargs) is None:
        return static_decode(model, prompt_input_ids, prompt_mask, num_generations,
                             max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                             generate_kwargs=generate_kwargs, share_prefill=share_prefill,
                             stop_check_every=stop_check_every or STOP_CHECK_EVERY)
    return segmented_generate(model, prompt_input_ids, prompt_mask, num_generations,
                              max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                              generate_kwargs=generate_kwargs, share_prefill=share_prefill,
                              drop_finished_every=drop_finished_every, compiled=compiled)


def row_prompts(prompt_input_ids, num_generations):
    """[N*M] long: the prompt of each row (the M completions of prompt i: rows i*M .. i*M+M-1)."""
    return torch.arange(len(prompt_input_ids), device=prompt_input_ids.device) \
        .repeat_interleave(num_generations)


def segmented_generate(model, prompt_input_ids, prompt_mask, num_generations, *, max_new_tokens,
                       pad_id, eos_id, generate_kwargs, share_prefill, drop_finished_every,
                       compiled):
    """The fast generate: the shared prefill into a roomy (or static, compiled) cache, then
    generate in segments of drop_finished_every tokens (None: one), the finished rows and their
    cache dropped between segments."""
    device = prompt_input_ids.device
    cache = None  # generate makes its own
    if share_prefill and num_generations > 1 and prompt_input_ids.shape[1] > 1:
        cache = kv_cache.prefill_prompt_cache(model, prompt_input_ids, prompt_mask,
                                              row_prompts(prompt_input_ids, num_generations))
    prompt_input_ids = prompt_input_ids.repeat_interleave(num_generations, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    completion_ids = torch.full((len(prompt_input_ids), max_new_tokens), pad_id, device=device)
    running = torch.arange(len(prompt_input_ids), device=device)  # rows still decoding
    input_ids, attention_mask, width = prompt_input_ids, prompt_mask, 0
    while True:
        segment = min(drop_finished_every or max_new_tokens, max_new_tokens - width)
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                **generate_options(model, cache, len(input_ids),
                                                   input_ids.shape[1], max_new_tokens - width,
                                                   compiled),
                                max_new_tokens=segment, pad_token_id=pad_id, eos_token_id=eos_id,
                                return_dict_in_generate=True, **generate_kwargs)
        new_ids = output.sequences[:, input_ids.shape[1]:]
        completion_ids[running, width:width + new_ids.shape[1]] = new_ids
        width += new_ids.shape[1]
        going = ~torch.isin(new_ids, torch.tensor(eos_id, device=device)).any(dim=1)
        # done: all max_new_tokens, or every row stopped (the only reason generate returns short
        # of `segment`)
        if width == max_new_tokens or new_ids.shape[1] < segment or not going.any():
            return prompt_input_ids, prompt_mask, completion_ids[:, :width]
        # the unfinished rows go on from their sequences so far; the cache holds all but their
        # last token
        running, input_ids = running[going], output.sequences[going]
        attention_mask = torch.cat([attention_mask, torch.ones_like(new_ids)], dim=1)[going]
        cache = getattr(output, kv_cache.cache_name(model))
        cache.batch_select_indices(going.nonzero().squeeze(1))


# --------------------------------------------------------------------------------------------------
# --fast-generate's decode loop: one static-cache step with the sampling inside, the stop check
# every k tokens; on CUDA the step is one CUDA graph, one host call a token
# --------------------------------------------------------------------------------------------------
STOP_CHECK_EVERY = 8  # decode steps between two reads of "every row finished" (the one host sync)
SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty")
LOOP_ATTENTION = ("sdpa", "eager")  # take the loop's 4D mask as it is (flash attention wants 2D)


def decode_loop_refusal(model, generate_kwargs):
    """Why the decode loop does not apply to this call (a line), or None: it needs the layered
    cache API (the static cache), a plain KV cache, an attention that takes a 4D mask, and only
    the sampling settings rollout.py gives (SAMPLING_KEYS, no repetition penalty). Where it does
    not apply, --fast-generate is generate's compiled static-cache call, as before."""
    if not kv_cache.LAYERED_CACHE:
        return "no layered cache API in this transformers"
    if not model._supports_default_dynamic_cache():
        return "the model keeps no plain KV cache"
    if any(kind != "full_attention" for kind in
           getattr(model.config.get_text_config(), "layer_types", None) or ()):
        return "layers other than full attention (the static cache's plain layers only)"
    if model.config._attn_implementation not in LOOP_ATTENTION:
        return f"attention {model.config._attn_implementation!r} (the loop: {LOOP_ATTENTION})"
    if set(generate_kwargs) - set(SAMPLING_KEYS) or \
            generate_kwargs.get("repetition_penalty") not in (None, 1.0):
        return f"sampling settings {sorted(generate_kwargs)} beyond {SAMPLING_KEYS}"
    return None


def token_sampler(generate_kwargs):
    """scores [B, V] (the step's logits in float32) -> tokens [B], as generate picks them: its
    warpers (temperature, top-k, top-p, in its order, under its conditions), then argmax, or one
    draw of torch.multinomial(softmax(scores), 1) written as what that call runs for one sample:
    exponential noise E [B, V] from the same generator, argmax(p / E) (the same random numbers
    consumed, the same token: tests/test_fast_generate.py) without multinomial's host-side
    checks of p, which would stop a CUDA graph."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    if not generate_kwargs.get("do_sample"):
        return lambda scores: scores.argmax(dim=-1)
    temperature, top_k, top_p = (generate_kwargs.get(key) for key in ("temperature", "top_k",
                                                                       "top_p"))
    warpers = [TemperatureLogitsWarper(temperature)] if temperature not in (None, 1.0) else []
    warpers += [TopKLogitsWarper(top_k=top_k)] if top_k not in (None, 0) else []
    warpers += [TopPLogitsWarper(top_p=top_p)] if top_p is not None and top_p < 1.0 else []

    def sample(scores):
        for warper in warpers:
            scores = warper(None, scores)
        probs = torch.softmax(scores, dim=-1)
        return (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1)
    return sample


def static_decode(model, prompt_input_ids, prompt_mask, num_generations, *, max_new_tokens, pad_id,
                  eos_id, generate_kwargs, share_prefill, stop_check_every):
    """--fast-generate: the prompts but their last token prefilled (shared: once per prompt) into
    the static cache, then decode_loop -> (prompt ids, prompt mask [N*M, P], completion ids
    [N*M, T'] with T' <= max_new_tokens as generate returns them)."""
    rows, width = len(prompt_input_ids) * num_generations, prompt_input_ids.shape[1]
    prefilled = None
    if width > 1:
        if share_prefill and num_generations > 1:
            rows_of = row_prompts(prompt_input_ids, num_generations)
            prefilled = kv_cache.prefill_prompt_cache(model, prompt_input_ids, prompt_mask, rows_of)
        else:
            prefilled = kv_cache.prefill_prompt_cache(
                model, prompt_input_ids.repeat_interleave(num_generations, dim=0),
                prompt_mask.repeat_interleave(num_generations, dim=0),
                torch.arange(rows, device=prompt_input_ids.device))
    cache = kv_cache.static_cache(model, prefilled, rows, width, max_new_tokens)
    prompt_input_ids = prompt_input_ids.repeat_interleave(num_generations, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    return prompt_input_ids, prompt_mask, decode_loop(
        model, cache, prompt_input_ids, prompt_mask, max_new_tokens=max_new_tokens, pad_id=pad_id,
        eos_id=eos_id, generate_kwargs=generate_kwargs, stop_check_every=stop_check_every)


def decode_step(model, cache, prompt_input_ids, prompt_mask, *, max_new_tokens, pad_id, eos_id,
                generate_kwargs):
    """(step, state): step() decodes one token of every row, as one iteration of generate's
    sampling loop, with no host sync and no Python branch on device values (what a CUDA graph
    can hold); state: the tensors it reads and writes in place.

    The cache holds the prompts' first P-1 positions; the first step feeds the last prompt token
    (at cache position P-1), each next step the token sampled before. Per step: the new position
    joins the 4D attention mask (prompt padding masked, every generated column attended, as
    generate's mask; eager attention takes it additive), the model runs one position per row,
    token_sampler picks, a finished row gets pad_id, the token goes to completion[:, column], a
    row that wrote an EOS is finished; state["steps"] counts the steps that began with a row
    unfinished: generate's number of steps (it stops when none is left)."""
    rows, width = prompt_input_ids.shape
    device = prompt_input_ids.device
    length = cache.layers[0].max_cache_len
    key_mask = torch.zeros(rows, length, dtype=torch.bool, device=device)
    key_mask[:, :width] = prompt_mask.bool()
    state = dict(token=prompt_input_ids[:, -1:].clone(),
                 position=prompt_mask.long().sum(dim=1, keepdim=True) - 1,  # generate's positions
                 cache_position=torch.full((1,), width - 1, device=device),
                 column=torch.zeros(1, dtype=torch.long, device=device),
                 unfinished=torch.ones(rows, dtype=torch.long, device=device),
                 steps=torch.zeros((), dtype=torch.long, device=device),
                 completion=torch.full((rows, max_new_tokens), pad_id, device=device),
                 key_mask=key_mask)
    eos = torch.as_tensor(eos_id, device=device).reshape(-1)
    sample = token_sampler(generate_kwargs)
    mask_dtype = model.get_input_embeddings().weight.dtype  # generate's eager mask: the embeddings'
    additive = model.config._attn_implementation == "eager"
    forward = {kv_cache.cache_name(model): cache, "use_cache": True}
    if "cache_position" in inspect.signature(model.forward).parameters:  # before transformers 5.x
        forward["cache_position"] = state["cache_position"]

    @torch.no_grad()
    def step():
        key_mask.index_fill_(1, state["cache_position"], True)
        mask = key_mask[:, None, None, :]
        if additive:
            mask = torch.zeros(mask.shape, dtype=mask_dtype, device=device).masked_fill(
                ~mask, torch.finfo(mask_dtype).min)
        logits = model(input_ids=state["token"], attention_mask=mask,
                       position_ids=state["position"], **forward).logits
        unfinished = state["unfinished"]
        scores = logits[:, -1].to(dtype=torch.float32)  # as generate: float32 scores
        state["scores_shape"] = scores.shape  # what a step draws (decode_loop's redraw)
        tokens = sample(scores)
        tokens = tokens * unfinished + pad_id * (1 - unfinished)
        state["steps"].add_(unfinished.amax())
        state["completion"].index_copy_(1, state["column"], tokens[:, None])
        unfinished.mul_((~torch.isin(tokens, eos)).long())
        state["token"].copy_(tokens[:, None])
        for counter in ("position", "cache_position", "column"):
            state[counter].add_(1)
    return step, state


def decode_loop(model, cache, prompt_input_ids, prompt_mask, *, max_new_tokens, pad_id, eos_id,
                generate_kwargs, stop_check_every):
    """completion ids [rows, T'] of generate's sampling loop, token for token under a seed, from
    decode_step run max_new_tokens times at most: on CUDA its first run eager, then captured as
    one CUDA graph and replayed (cuda_graph); elsewhere eager. prompt_input_ids, prompt_mask
    [rows, P], left-padded; cache: the static cache holding their first P-1 positions.

    The host reads the device once every stop_check_every steps (state["steps"]: has every row
    finished?). generate stops at the step where the last row finished, so the loop may run up to
    stop_check_every - 1 steps more: they write pad into finished rows, their columns are cut
    (T' = generate's steps), and their random draws are undone (the generator goes back to the
    state before the block and draws again for the block's counted steps), so that the random
    numbers after the call are generate's too."""
    step, state = decode_step(model, cache, prompt_input_ids, prompt_mask,
                              max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                              generate_kwargs=generate_kwargs)
    device = prompt_input_ids.device
    sampled = bool(generate_kwargs.get("do_sample"))
    run, steps = None, 0
    for start in range(0, max_new_tokens, stop_check_every):
        end = min(start + stop_check_every, max_new_tokens)
        before = rng_state(device) if sampled else None
        for _ in range(start, end):
            if run is not None:
                run()
            elif graphs_on(device):  # the first step runs eagerly, then it is captured
                run = cuda_graph(step, device)
            else:
                step()
                run = step
        steps = int(state["steps"])  # the stop check: the loop's one blocking host sync
        if steps < end:  # every row finished at `steps`: the block's extra draws undone
            if before is not None:
                redraw(device, before, steps - start, state["scores_shape"])
            break
    return state["completion"][:, :steps]


def graphs_on(device):
    """Whether decode_loop captures its step: on CUDA devices."""
    return device.type == "cuda"


def rng_state(device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def redraw(device, state, draws, shape):
    """The default generator of `device` set back to `state`, then `draws` steps' random numbers
    drawn again (token_sampler's exponential noise of `shape`, float32)."""
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)
    for _ in range(draws):
        torch.empty(shape, dtype=torch.float32, device=device).exponential_(1)


def cuda_graph(step, device, cuda=torch.cuda):
    """step() run once eagerly (on a side stream, as torch.cuda.graphs asks of a warm-up: lazy
    allocations, cuBLAS workspaces, autocast's weight casts) -> then captured as one CUDA graph:
    the returned function replays it, one host call a token. Its random numbers come from the
    default CUDA generator, which torch registers with every graph (philox seed and offset read at
    each replay, the offset advanced by the graph's draws: other draws each replay, as eager
    steps). `cuda`: torch.cuda, or a stand-in (tests/test_fast_generate.py runs this on a CPU)."""
    stream = cuda.Stream(device)
    stream.wait_stream(cuda.current_stream(device))
    with cuda.stream(stream):
        step()
    cuda.current_stream(device).wait_stream(stream)
    graph = cuda.CUDAGraph()
    with cuda.graph(graph):
        step()  # recorded, not run
    return graph.replay
