"""--fast-generate's KV cache: the prompts' prefill, copied into a static cache (fixed-size
tensors written in place, what a CUDA graph can hold; fast/decode_loop.py).

It builds on transformers' layered cache API (tested with 4.57.6, 5.17, 5.25). Where it is missing
or older (4.50-4.56) LAYERED_CACHE is False and --fast-generate is the plain call.
"""
import inspect

import torch
from transformers import StaticCache

try:  # the layered cache API: a DynamicCache made of per-layer objects, initialized lazily
    from transformers.cache_utils import DynamicLayer, StaticLayer
    LAYERED_CACHE = hasattr(DynamicLayer, "lazy_initialization") \
        and hasattr(DynamicLayer(), "is_initialized")  # 4.54-4.56 had layers without these
except ImportError:  # an older transformers: HF's concatenating cache as it is
    DynamicLayer, StaticLayer, LAYERED_CACHE = object, object, False


def cache_name(model):
    """The KV cache's argument / output field: `cache` in transformers 5.x, `past_key_values`
    before the rename."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prefill(model, input_ids, attention_mask):
    """The KV cache (a DynamicCache) of the prompts but their last token: input_ids,
    attention_mask [rows, P], left-padded; positions as generate's (real tokens before, 0 on the
    padding). None where the model keeps no plain KV cache (a recurrent state, linear attention)."""
    if not model._supports_default_dynamic_cache():
        return None
    position_ids = (attention_mask.cumsum(dim=1) - 1).masked_fill(attention_mask == 0, 0)
    output = model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                   position_ids=position_ids[:, :-1], use_cache=True, logits_to_keep=1)
    cache = getattr(output, cache_name(model))
    return None if cache is None or any(getattr(cache, "is_linear", ())) else cache


CACHE_BUCKET = 64  # cache lengths are multiples of this: one captured graph serves many widths
KEPT_SHAPES = 2  # static caches kept on the model (row counts): a last, smaller call's among them


class TypedStaticLayer(StaticLayer):
    """A StaticLayer whose keys and values are kept in `dtype`, the forward's compute dtype: under
    bf16 autocast attention reads them in bf16 anyway (a cast of a cast, exact), so half the bytes
    and no cast of the whole cache a step (transformers' StaticLayer keeps RoPE's fp32 keys)."""

    def __init__(self, max_cache_len, dtype):
        super().__init__(max_cache_len)
        self.kept_dtype = dtype

    def update(self, key_states, value_states, *args, **kwargs):
        return super().update(key_states.to(self.kept_dtype), value_states.to(self.kept_dtype),
                              *args, **kwargs)


def static_cache(model, prefilled, rows, prompt_width, max_new_tokens):
    """A StaticCache of `rows` rows with room for the prompt and max_new_tokens, holding
    `prefilled`'s positions (the prompts' first prompt_width - 1; None: nothing yet).

    Kept on the model for the next call of as many rows (the loop's step and CUDA graphs are tied
    to its tensors; a longer call replaces it with a longer one, the steps then read it masked),
    KEPT_SHAPES row counts at most: calls alternating between two shapes capture once each.
    Keys and values in the compute dtype (TypedStaticLayer)."""
    length = -(-(prompt_width + max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET
    parameter = next(model.parameters())
    device = parameter.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) \
        else parameter.dtype
    kept = model.__dict__.setdefault("_fast_generate_caches", {})  # (rows, dtype) -> cache
    cache = kept.pop((rows, dtype), None)
    if cache is None or cache.layers[0].max_cache_len < length:
        cache = StaticCache(config=model.config, max_cache_len=length)
        cache.layers = [TypedStaticLayer(layer.max_cache_len, dtype)
                        if type(layer) is StaticLayer else layer for layer in cache.layers]
    kept[(rows, dtype)] = cache  # the most recent last; the oldest beyond KEPT_SHAPES dropped
    for key in list(kept)[:-KEPT_SHAPES]:
        del kept[key]
    cache.reset()  # zeros, length 0 (the layers of a new cache allocate on their first update)
    if prefilled is not None:
        for layer, source in zip(cache.layers, prefilled.layers):
            layer.update(source.keys, source.values)  # positions 0 .. P-2, written in place
    return cache
