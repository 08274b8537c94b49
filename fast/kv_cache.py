"""The KV cache, in one place: the shared prompt prefill, the roomy cache and the static cache.

  prefill_prompt_cache  each distinct prompt runs through the model once; its keys and values are
                        indexed out to its M rows (generate's shared prefill and the training
                        forward's shared prompts, fast/logprobs.py)
  roomy_cache           HF's DynamicCache copies the whole cache a step (a concatenation; at 16
                        rows x 172 positions of SmolLM2-135M 127 MB a token); the roomy one keeps
                        keys and values at the front of buffers with room: one position written
  static_cache          --fast-generate's fixed-size cache (fast/decode_loop.py)

The roomy and static caches build on transformers' layered cache API (tested with 4.57.6, 5.17,
5.24, 5.25). Where it is missing or older (4.50-4.56) LAYERED_CACHE is False: generate gets HF's
cache as it is and --fast-generate the plain call: the same completions, slower.
"""
import inspect

import torch
from transformers import DynamicCache, StaticCache

try:  # the layered cache API: a DynamicCache made of per-layer objects, initialized lazily
    from transformers.cache_utils import DynamicLayer, StaticLayer
    LAYERED_CACHE = hasattr(DynamicLayer, "lazy_initialization") \
        and hasattr(DynamicLayer(), "is_initialized")  # 4.54-4.56 had layers without these
except ImportError:  # an older transformers: HF's concatenating cache as it is
    DynamicLayer, StaticLayer, LAYERED_CACHE = object, object, False
LAZY_INITIALIZATION_ARGS = len(inspect.signature(DynamicLayer.lazy_initialization).parameters) - 1 \
    if LAYERED_CACHE else 0


def cache_name(model):
    """The KV cache's argument / output field: `cache` in transformers 5.x, `past_key_values`
    before the rename."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# --------------------------------------------------------------------------------------------------
# Shared prompts: each distinct prompt runs through the model once, its cache indexed to its rows
# --------------------------------------------------------------------------------------------------
def prefill_prompt_cache(model, input_ids, attention_mask, row_prompt):
    """KV cache of prompts but their last token, computed once per distinct prompt and indexed out
    to the rows.

    input_ids, attention_mask [N, P]: N distinct prompts, left-padded; row_prompt [B] (long): the
    prompt of each row. The caller then feeds each row from the last prompt token on. Positions
    are generate's (real tokens before; 0 for padding). Under autograd the cache carries gradients
    back to the one prompt forward (fast/logprobs.py). Returns a Cache of batch B, or None when
    sharing does not apply (a cache that is not a plain KV cache)."""
    if not model._supports_default_dynamic_cache():  # Mamba-style models keep a recurrent state
        return None
    position_ids = (attention_mask.cumsum(dim=1) - 1).masked_fill(attention_mask == 0, 0)
    output = model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                   position_ids=position_ids[:, :-1], use_cache=True, logits_to_keep=1)
    cache = getattr(output, cache_name(model))
    # no cache (e.g. gradient checkpointing), or linear-attention layers (a state, not positions)
    if cache is None or any(getattr(cache, "is_linear", ())):
        return None
    cache.batch_select_indices(row_prompt)  # plain indexing: a prompt's keys and values, per row
    return cache


def row_prompts(prompt_input_ids, num_generations):
    """[N*M] long: the prompt of each row (the M completions of prompt i: rows i*M .. i*M+M-1)."""
    return torch.arange(len(prompt_input_ids), device=prompt_input_ids.device) \
        .repeat_interleave(num_generations)


def shared_prompt_cache(model, input_ids, attention_mask, prompt_width):
    """The prompts' KV cache for the rows of input_ids, attention_mask [b, P+T] (P = prompt_width),
    or None.

    None when no two rows share a prompt (nothing to save) or prefill_prompt_cache declines. A
    prompt is its ids and its mask together, so two rows share one only when their left padding is
    the same too.
    """
    prompts = torch.cat([input_ids[:, :prompt_width],
                         attention_mask[:, :prompt_width].to(input_ids.dtype)], dim=1)
    distinct, row_prompt = torch.unique(prompts, dim=0, return_inverse=True)  # [N, 2P]: ids | mask
    if len(distinct) == len(prompts):
        return None
    return prefill_prompt_cache(model, distinct[:, :prompt_width], distinct[:, prompt_width:],
                                row_prompt)


# --------------------------------------------------------------------------------------------------
# The roomy cache: a DynamicCache written in place (always on, unless --no-fast)
# --------------------------------------------------------------------------------------------------
class RoomyLayer(DynamicLayer):
    """A DynamicLayer whose keys and values [B, H, L, D] are the front of buffers
    [B, H, capacity, D].

    update() writes the new positions into the buffers and returns views of the first L + new
    (DynamicLayer concatenates, copying the L every step). What replaces the rows
    (batch_select_indices, batch_repeat_interleave, reorder_cache) drops the buffers, as
    DynamicCache's old rows would go; the next update moves the kept rows into new ones. crop()
    keeps a front view. The buffers hold `capacity` positions from the first update on (what
    harness/memory.py's plan counts)."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity
        self.key_buffer = self.value_buffer = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:  # takes (key_states) in transformers 4.57, (key, value) in 5.x
            self.lazy_initialization(*(key_states, value_states)[:LAZY_INITIALIZATION_ARGS])
        length, new = self.get_seq_length(), key_states.shape[-2]
        if length and key_states.shape[:2] != self.keys.shape[:2]:  # a write would broadcast
            raise ValueError(f"new keys {tuple(key_states.shape)} do not match the cache's "
                             f"{tuple(self.keys.shape)}")
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
            kept.numel() > 0 and kept.data_ptr() == buffer.data_ptr()
            and kept.stride() == buffer.stride() and kept.shape[:2] == buffer.shape[:2]
            for kept, buffer in ((self.keys, self.key_buffer), (self.values, self.value_buffer)))

    def move_to_buffers(self, key_states, value_states, capacity):
        length = self.get_seq_length()
        self.key_buffer = key_states.new_empty(*key_states.shape[:2], capacity,
                                               key_states.shape[-1])
        self.value_buffer = value_states.new_empty(*value_states.shape[:2], capacity,
                                                   value_states.shape[-1])
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
        """Empty, the buffers dropped (as DynamicLayer.reset in transformers >= 5.11)."""
        self.is_initialized = False  # before super(): nothing left to zero
        self.keys = self.values = self.key_buffer = self.value_buffer = None
        super().reset()


def roomy_cache(model, prefilled, capacity):
    """The cache for a generate call: `prefilled` (a DynamicCache, e.g. the shared prefill) or, if
    None, an empty DynamicCache, each plain full-attention layer a RoomyLayer of `capacity`
    positions (the prompt and max_new_tokens); other layer kinds as they are; None without a plain
    KV cache (generate makes its own). Without the layered cache API: `prefilled`."""
    if not LAYERED_CACHE or (prefilled is None
                             and not model._supports_default_dynamic_cache()):
        return prefilled
    cache = prefilled if prefilled is not None else DynamicCache(config=model.config)
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return cache  # quantized or offloaded: as they are
    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            roomy = RoomyLayer(capacity)
            if layer.is_initialized and layer.get_seq_length() > 0:
                roomy.update(layer.keys, layer.values)
            cache.layers[index] = roomy
    return cache


def concatenating_cache(model, prefilled, capacity):
    """roomy_cache's stand-in that hands generate HF's DynamicCache as it is (benchmarks and tests
    measure against it)."""
    return prefilled


# --------------------------------------------------------------------------------------------------
# --fast-generate's static cache: fixed-size tensors written in place (fast/generate.py compiles)
# --------------------------------------------------------------------------------------------------
CACHE_BUCKET = 64  # cache lengths are multiples of this: a compiled shape serves many prompt widths


class TypedStaticLayer(StaticLayer):
    """A StaticLayer whose keys and values are kept in `dtype`: the forward's compute dtype.

    Under bf16 autocast over fp32 weights a layer's keys leave RoPE in fp32 and its values leave
    v_proj in bf16 (transformers' StaticLayer allocates both in the keys' dtype: fp32); attention
    casts both to bf16 at each step (its matmuls and sdpa run in autocast's dtype). Kept in bf16,
    the cache holds what attention reads: the same values (a cast of a cast, exact), half the
    bytes, no cast of the whole cache a step (12.1 of the 25.5 MB a step writes per layer at
    Qwen2.5-0.5B's attention, 128 rows, cache 320: benchmarks/decode_ops.py --bytes)."""

    def __init__(self, max_cache_len, dtype):
        super().__init__(max_cache_len)
        self.kept_dtype = dtype

    def update(self, key_states, value_states, *args, **kwargs):
        return super().update(key_states.to(self.kept_dtype), value_states.to(self.kept_dtype),
                              *args, **kwargs)


def static_cache(model, prefilled, rows, prompt_width, max_new_tokens):
    """A StaticCache of `rows` rows and room for the prompt and max_new_tokens, holding
    `prefilled`'s positions.

    prefilled: the DynamicCache of the shared prefill (batch `rows`, the prompt's first
    prompt_width - 1 positions), or None (generate then prefills it). The cache is kept on the
    model for the next call of its shape (the compiled step and the loop's CUDA graphs are tied to
    its tensors); a call of another shape drops it. Keys and values in the compute dtype."""
    length = -(-(prompt_width + max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET
    parameter = next(model.parameters())
    device = parameter.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) \
        else parameter.dtype
    key = (rows, length, dtype)
    cache = model.__dict__.get("_fast_generate_caches", {}).get(key)
    if cache is None:
        cache = StaticCache(config=model.config, max_cache_len=length)
        cache.layers = [TypedStaticLayer(layer.max_cache_len, dtype)
                        if type(layer) is StaticLayer else layer for layer in cache.layers]
    model._fast_generate_caches = {key: cache}  # this shape's alone: another's is dropped
    cache.reset()  # zeros, length 0 (the layers of a new cache allocate on their first update)
    if prefilled is not None:
        for layer, source in zip(cache.layers, prefilled.layers):
            layer.update(source.keys, source.values)  # positions 0 .. P-2, written in place
    return cache
