"""The fast paths of rollout.sample_completions' generate call: the same completions, less time
per token (the shared prefill, the roomy cache, finished rows dropped, opt-in a static-cache decode
loop), and the self-check that holds them to the plain call on a device where they never ran.

On (`--no-fast` turns it off): on a CPU the roomy cache (fast/kv_cache.py), DynamicCache's values
written in place instead of concatenated, in the same generate call (ROOMY_CACHE_DEVICES: where
it was measured faster; on CUDA HF's own cache).

Opt-in (`--fast-generate`): the decode loop (fast/decode_loop.py: a static KV cache, one step with
the sampling inside, a CUDA graph on CUDA, the stop check every k tokens) instead of eager
generate's dispatched ops and a blocking read a token (1 907 ops a token in the 24-layer run of
benchmarks/decode_ops.py, on a CPU; bound by Python and launches on a GPU: inferred). Where the
loop does not apply (decode_loop_refusal), or with decode_loop=False, generate's own call on the
static cache with transformers' compile_config (on CUDA mode "reduce-overhead"). A static cache
is read to its full length (masked), cannot drop finished rows (config refuses
--drop-finished-every with it) and stays allocated on the model between steps. Without
transformers' layered cache API (kv_cache.LAYERED_CACHE) --fast-generate is the plain call.

The self-check (self_check): these paths are tested token for token on this project's CPUs only.
At the first rollout on a CUDA device, a few greedy tokens of two rows are generated both ways;
on any difference, or an exception raised by a fast path, the run says so in one line and
generates with the plain call from then on.
"""
import warnings

import torch
from transformers import CompileConfig

from fast import decode_loop as loop, kv_cache


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
    exception of the plain call is a bug to see: it propagates with its traceback). Autocast off:
    the check is of positions, cache and masks; under bf16 two kernel paths' rounding flips the
    near ties of a random model (a top-2 logit gap of 0.0045 where bf16 moves a logit 0.042).

    sample(fast=, compiled=, max_new_tokens=) -> (prompt ids, prompt mask, completion ids) of two
    rows, greedy (rollout.sample_completions with its other arguments bound)."""
    verdicts = model.__dict__.setdefault("_fast_self_check", {})
    if not untested_device(model) or compiled in verdicts:
        return verdicts.get(compiled, True)
    device = next(model.parameters()).device.type
    paths = getattr(sample, "compiled_path", "the static cache and compiled generate") \
        if compiled else "the roomy cache" if device in ROOMY_CACHE_DEVICES \
        else "the shared prefill into HF's cache"
    with torch.autocast(device, enabled=False):
        plain = sample(fast=False, compiled=False, max_new_tokens=SELF_CHECK_TOKENS)
        rows = f"fast-path self-check ({len(plain[2])} rows x {SELF_CHECK_TOKENS} greedy tokens)"
        try:
            fast = sample(fast=True, compiled=compiled, max_new_tokens=SELF_CHECK_TOKENS)
        except Exception as error:  # noqa: BLE001 -- a fast path's failure is its verdict, one line
            verdicts[compiled] = False
            log(f"{rows}: {paths} {failed(error)}")
            return False
    verdicts[compiled] = all(torch.equal(a, b) for a, b in zip(plain, fast))
    log(f"{rows}: {paths} match plain generate" if verdicts[compiled] else
        f"{rows}: {paths} DIFFER from plain generate on this device: "
        "generating with the plain call for this run (--no-fast does so from the start)")
    return verdicts[compiled]


def failed(error):
    """A fast path's exception as the one line that says so."""
    first_line = (str(error).strip().splitlines() or [""])[0][:200]
    return (f"FAILED on this device ({type(error).__name__}: {first_line}): generating with the "
            "plain call for this run (--no-fast does so from the start)")


# --------------------------------------------------------------------------------------------------
# rollout.sample_completions' fast path, the self-check first where the paths were never tested
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
    drop_finished_every: generate that many tokens at a time, the rows that reached EOS (and their
    cache) then dropped (other random draws than one call). compiled (--fast-generate): with
    decode_loop fast/decode_loop.py (the stop check every stop_check_every tokens, None: its
    default), else generate's compiled call. On a device the paths were never tested on,
    self_check runs first, and a fast path that raises (a capture at the real batch) is one line
    and the plain call."""
    if compiled and drop_finished_every:
        raise ValueError("fast generate keeps every row in its static cache: "
                         "no drop_finished_every")
    options = dict(pad_id=pad_id, eos_id=eos_id, decode_loop=decode_loop,
                   stop_check_every=stop_check_every)
    if not self_check(model, check_sample(model, plain, prompt_input_ids[:1], prompt_mask[:1],
                                          share_prefill, **options), compiled):
        return None
    before = loop.rng_state(prompt_input_ids.device)
    try:
        return fast_generate(model, prompt_input_ids, prompt_mask, num_generations, **options,
                             max_new_tokens=max_new_tokens, generate_kwargs=generate_kwargs,
                             share_prefill=share_prefill, drop_finished_every=drop_finished_every,
                             compiled=compiled)
    except Exception as error:  # noqa: BLE001 -- e.g. a capture at the real batch: as the check's
        if not untested_device(model):
            raise
        model._fast_self_check[compiled] = False
        model.__dict__.pop("_fast_generate_caches", None)  # its static cache (and graphs) freed
        print(f"fast path ({len(prompt_input_ids) * num_generations} rows): {failed(error)}")
        loop.redraw(prompt_input_ids.device, before, 0, None)  # the plain call draws as --no-fast
        return None


def check_sample(model, plain, prompt_input_ids, prompt_mask, share_prefill, *, pad_id, eos_id,
                 **options):
    """What self_check compares: sample(fast=, compiled=, max_new_tokens=) -> two greedy rows of
    the prompt. options: fast_generate's decode_loop, stop_check_every."""
    def sample(fast, compiled, max_new_tokens):
        call = dict(max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                    generate_kwargs=GREEDY)
        if fast:
            return fast_generate(model, prompt_input_ids, prompt_mask, 2, drop_finished_every=None,
                                 compiled=compiled, share_prefill=share_prefill, **call, **options)
        ids = prompt_input_ids.repeat_interleave(2, dim=0)
        mask = prompt_mask.repeat_interleave(2, dim=0)
        return ids, mask, plain(model, ids, mask, **call)
    looped = options.get("decode_loop", True) and loop.decode_loop_refusal(model, GREEDY) is None
    graph = ", one CUDA graph a step" if prompt_input_ids.device.type == "cuda" else ""
    sample.compiled_path = f"the decode loop on the static cache{graph}" if looped \
        else "the static cache and compiled generate"  # self_check's words for --fast-generate
    return sample


def fast_generate(model, prompt_input_ids, prompt_mask, num_generations, *, max_new_tokens, pad_id,
                  eos_id, generate_kwargs, share_prefill, drop_finished_every, compiled,
                  decode_loop=True, stop_check_every=None):
    """The fast paths' (prompt ids, prompt mask, completion ids): --fast-generate's decode loop
    where it applies, else generate on the roomy (or static, compiled) cache."""
    if compiled and decode_loop and loop.decode_loop_refusal(model, generate_kwargs) is None:
        return loop.static_decode(model, prompt_input_ids, prompt_mask, num_generations,
                                  max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                                  generate_kwargs=generate_kwargs, share_prefill=share_prefill,
                                  stop_check_every=stop_check_every or loop.STOP_CHECK_EVERY)
    return segmented_generate(model, prompt_input_ids, prompt_mask, num_generations,
                              max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                              generate_kwargs=generate_kwargs, share_prefill=share_prefill,
                              drop_finished_every=drop_finished_every, compiled=compiled)


def segmented_generate(model, prompt_input_ids, prompt_mask, num_generations, *, max_new_tokens,
                       pad_id, eos_id, generate_kwargs, share_prefill, drop_finished_every,
                       compiled):
    """The fast generate: the shared prefill into a roomy (or static, compiled) cache, then
    generate in segments of drop_finished_every tokens (None: one), the finished rows and their
    cache dropped between segments."""
    device = prompt_input_ids.device
    cache = None  # generate makes its own
    if share_prefill and num_generations > 1 and prompt_input_ids.shape[1] > 1:
        cache = kv_cache.prefill_prompt_cache(
            model, prompt_input_ids, prompt_mask,
            kv_cache.row_prompts(prompt_input_ids, num_generations))
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
