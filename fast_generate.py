"""The fast paths of rollout.sample_completions' generate call: the same completions, less time per token.

Always on: `roomy_cache`. HF's DynamicCache grows by a concatenation per layer and step: each decode step copies
the whole cache (at 16 rows x 172 positions of SmolLM2-135M, 127 MB read and written per token, a quarter of the
weights' bytes). `roomy_cache` hands generate the same DynamicCache whose full-attention layers keep their keys
and values at the front of buffers with room for the completion: a step writes its one position in place and
attention reads the same values from a view (tests/test_fast_generate.py: completions token for token identical).

Opt-in (`--fast-generate`): the plain generate runs in eager mode: every decode step runs the model's Python
forward op by op. On a GPU that step is bound by Python and kernel launches (hundreds of kernels per token for a
small model), far from what the weights' bytes and the FLOPs allow (benchmarks/floor.py). The option hands the
same generate call two things transformers already supports:

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
from transformers import CompileConfig, DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer

from fast_logprobs import cache_name


# ---------------------------------------------------------------------------------------------------------------
# Always on: a dynamic cache written in place
# ---------------------------------------------------------------------------------------------------------------
class RoomyLayer(DynamicLayer):
    """A DynamicLayer whose keys and values [B, H, L, D] are the front of buffers [B, H, capacity, D].

    update() writes the new positions into the buffers and returns views of the first L + new positions: no copy of
    the L positions already there (DynamicLayer concatenates, copying them every step). What replaces the rows
    (batch_select_indices when generate's finished rows are dropped, batch_repeat_interleave, reorder_cache) drops
    the buffers, so that their memory goes as DynamicCache's old rows would; the next update moves the kept rows
    into new buffers. crop() keeps a front view, so positions past it are written over, as they would be
    appended. The buffers hold `capacity` positions from the first update on: what a DynamicCache reaches
    once a row runs to max_new_tokens, and what harness/memory.py's plan counts."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity
        self.key_buffer = self.value_buffer = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, new = self.get_seq_length(), key_states.shape[-2]
        if length and key_states.shape[:2] != self.keys.shape[:2]:  # a cat would fail; a write would broadcast
            raise ValueError(f"new keys {tuple(key_states.shape)} do not match the cache's {tuple(self.keys.shape)}")
        if not (self.fronts_buffers() and length + new <= self.key_buffer.shape[-2]):
            self.move_to_buffers(key_states, value_states, max(self.capacity, length + new))
        self.key_buffer[:, :, length:length + new] = key_states
        self.value_buffer[:, :, length:length + new] = value_states
        self.keys = self.key_buffer[:, :, :length + new]
        self.values = self.value_buffer[:, :, :length + new]
        return self.keys, self.values

    def fronts_buffers(self):
        """True when keys and values are still views of the buffers' first positions."""
        return self.key_buffer is not None and all(
            kept.numel() > 0 and kept.data_ptr() == buffer.data_ptr() and kept.stride() == buffer.stride()
            and kept.shape[:2] == buffer.shape[:2] for kept, buffer in ((self.keys, self.key_buffer),
                                                                        (self.values, self.value_buffer)))

    def move_to_buffers(self, key_states, value_states, capacity):
        length = self.get_seq_length()
        self.key_buffer = key_states.new_empty(*key_states.shape[:2], capacity, key_states.shape[-1])
        self.value_buffer = value_states.new_empty(*value_states.shape[:2], capacity, value_states.shape[-1])
        if length:
            self.key_buffer[:, :, :length] = self.keys
            self.value_buffer[:, :, :length] = self.values
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def batch_select_indices(self, indices):
        super().batch_select_indices(indices)
        self.key_buffer = self.value_buffer = None

    def batch_repeat_interleave(self, repeats):
        super().batch_repeat_interleave(repeats)
        self.key_buffer = self.value_buffer = None

    def reorder_cache(self, beam_idx):
        super().reorder_cache(beam_idx)
        self.key_buffer = self.value_buffer = None

    def reset(self):
        """Empty, the buffers dropped (as DynamicLayer.reset in transformers >= 5.11; older ones zero the keys)."""
        self.is_initialized = False  # before super(): nothing left to zero
        self.keys = self.values = self.key_buffer = self.value_buffer = None
        super().reset()


def roomy_cache(model, prefilled, capacity):
    """The cache for a generate call: `prefilled` (a DynamicCache, e.g. the shared prefill) or, if None, an empty
    DynamicCache of the model's layers, with each plain full-attention layer a RoomyLayer of `capacity` positions
    (the prompt and max_new_tokens). Other layer kinds (sliding windows, linear attention) are kept as they are;
    a model without a plain KV cache (Mamba-style) gets None: generate makes its own."""
    if prefilled is None and not model._supports_default_dynamic_cache():
        return None
    cache = prefilled if prefilled is not None else DynamicCache(config=model.config)
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):  # quantized or offloaded: as they are
        return cache
    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            roomy = RoomyLayer(capacity)
            if layer.is_initialized and layer.get_seq_length() > 0:
                roomy.update(layer.keys, layer.values)
            cache.layers[index] = roomy
    return cache


def concatenating_cache(model, prefilled, capacity):
    """roomy_cache's stand-in that hands generate HF's DynamicCache as it is (benchmarks and tests measure
    against it)."""
    return prefilled


# ---------------------------------------------------------------------------------------------------------------
# --fast-generate: a static cache and a compiled decode step
# ---------------------------------------------------------------------------------------------------------------
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
