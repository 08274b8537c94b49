"""The fast path of rollout.sample_completions' generate call: the same completions, less time per token.

rollout.py calls HF `generate` with a dynamic KV cache, in eager mode: every decode step runs the model's Python
forward op by op, and the cache grows by a concatenation per layer. On a GPU that step is bound by Python and
kernel launches (hundreds of kernels per token for a small model), far from what the weights' bytes and the FLOPs
allow (benchmarks/floor.py). This file hands the same generate call two things transformers already supports:

  1. a static KV cache (StaticCache: fixed-size tensors, written in place) holding the shared prefill: each prompt
     is still run through the model once (fast_logprobs.prefill_prompt_cache) and its keys and values copied into
     its M rows;
  2. transformers' compile_config: with a compileable cache, generate runs its decode steps through
     torch.compile(model.__call__). On CUDA in mode "reduce-overhead": CUDA graphs, one graph launch per token.
     On a CPU the same call compiles without graphs (mode "default").

The samples are the same: generate draws each token as before (the same logits processors and the same
torch.multinomial call per step on the same RNG), only the forward that produces the logits runs compiled, its
numbers equal up to float rounding (tests/test_fast_generate.py: greedy and seeded samples token for token).
Costs: compilation, once per run and per shape (batch rows, cache length; the cache length is rounded up to
CACHE_BUCKET so that prompts of other widths reuse it); a static cache is read to its full length at every step
(masked), it cannot drop finished rows (config refuses --fast-generate with --drop-finished-every), and it stays
allocated on the model between steps (the training forward runs beside it: peak memory grows by its size, rows x
cache length x the KV bytes of a position). The eval's greedy generate keeps the plain path (other shapes).
Numbers: benchmarks/rollout_time.py, docs/performance.md.
"""
import torch
from transformers import CompileConfig, StaticCache

from fast_logprobs import cache_name

CACHE_BUCKET = 64  # cache lengths are multiples of this: one compiled shape serves many prompt widths


def compile_mode(device):
    """CUDA graphs where there are CUDA devices; elsewhere inductor without graphs."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


def compile_config(device, mode=None):
    """transformers' CompileConfig for generate's decode step (fullgraph: a graph break would be a silent slowdown)."""
    config = CompileConfig(fullgraph=True, dynamic=False, mode=mode or compile_mode(device))
    config._compile_all_devices = True  # transformers compiles on CUDA-like devices only, unless told so
    return config


def static_cache(model, prefilled, rows, prompt_width, max_new_tokens):
    """A StaticCache of `rows` rows and room for the prompt and max_new_tokens, holding `prefilled`'s positions.

    prefilled: the DynamicCache of the shared prefill (batch `rows`, the prompt's first prompt_width - 1
    positions), or None (generate then prefills into the empty static cache itself). The cache of a shape is kept
    on the model and reset for the next call: the compiled step (and a CUDA graph) is tied to its tensors."""
    length = -(-(prompt_width + max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET
    kept = model.__dict__.setdefault("_fast_generate_caches", {})
    key = (rows, length, next(model.parameters()).dtype if prefilled is None else prefilled.layers[0].keys.dtype)
    if key not in kept:
        kept[key] = StaticCache(config=model.config, max_cache_len=length)
    cache = kept[key]
    cache.reset()  # zeros, length 0 (the layers of a new cache allocate on their first update)
    if prefilled is not None:
        for layer, source in zip(cache.layers, prefilled.layers):
            layer.update(source.keys, source.values)  # positions 0 .. P-2, written in place
    return cache


def generate_options(model, prefilled, rows, prompt_width, max_new_tokens, mode=None):
    """The extra keyword arguments of the generate call: the filled static cache and the compile settings."""
    device = next(model.parameters()).device
    return {cache_name(model): static_cache(model, prefilled, rows, prompt_width, max_new_tokens),
            "compile_config": compile_config(device, mode)}
