"""--fast-generate's decode loop: generate's sampling loop, token for token, on tensors written in
place: a static KV cache holding the prompts' prefill (fast/kv_cache.py), one step doing an iteration
of generate's loop with no host sync (decode_step; on CUDA captured once per shape: cuda_graph),
the stop check every STOP_CHECK_EVERY tokens (the steps past the last EOS cut, their draws undone).
Where it does not apply (decode_loop_refusal) rollout.py's plain generate call runs."""
import contextlib
import inspect

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as ATTENTION

from fast import kv_cache

STOP_CHECK_EVERY = 8  # decode steps between two reads of "every row finished" (the one host sync)
SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty")
LOOP_ATTENTION = ("sdpa", "eager")  # take the loop's 4D mask as it is (flash attention wants 2D)


def decode_loop_refusal(model, generate_kwargs):
    """Why the decode loop does not apply to this call (a line), or None: it needs the layered
    cache API (the static cache), a plain KV cache, an attention that takes a 4D mask, and only
    the sampling settings rollout.py gives (SAMPLING_KEYS, no repetition penalty). Where it does
    not apply, --fast-generate is the plain generate call."""
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
    warpers (temperature, top-k, top-p, in its order), then argmax, or the draw
    torch.multinomial(softmax(scores), 1) makes: exponential noise E [B, V] from the same
    generator, argmax(p / E), without multinomial's host-side checks (they would stop a graph)."""
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


def static_decode(model, input_ids, attention_mask, *, max_new_tokens, pad_id, eos_id,
                  generate_kwargs, stop_check_every=None, capture=True):
    """--fast-generate: the prompts but their last token prefilled into the static cache, then
    decode_loop -> completion ids [rows, T'], T' <= max_new_tokens as generate returns them.
    input_ids, attention_mask [rows, P]: the prompts, left-padded, each row its own (M rows of a
    prompt repeated). capture=False: eager steps on CUDA too (the self-check's reference)."""
    prefilled = kv_cache.prefill(model, input_ids, attention_mask) if input_ids.shape[1] > 1 \
        else None
    cache = kv_cache.static_cache(model, prefilled, len(input_ids), input_ids.shape[1],
                                  max_new_tokens)
    return decode_loop(model, cache, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                       pad_id=pad_id, eos_id=eos_id, generate_kwargs=generate_kwargs,
                       stop_check_every=stop_check_every or STOP_CHECK_EVERY, capture=capture)


def decode_step(model, cache, prompt_input_ids, prompt_mask, *, max_new_tokens, pad_id, eos_id,
                generate_kwargs):
    """(step, state): step() decodes one token of every row, as one iteration of generate's
    sampling loop, with no host sync and no Python branch on device values (what a CUDA graph
    can hold); state: the tensors it reads and writes in place, set for these prompts (begin).

    The cache holds the prompts' first P-1 positions; the first step feeds the last prompt token,
    each next step the token sampled before. Per step: the new position joins the 4D attention
    mask (generate's; eager attention takes it additive), the model runs one position per row
    (sdpa with its query heads packed: packed_sdpa), token_sampler picks, a finished row gets
    pad_id, the token goes to completion[:, column], a row that wrote an EOS is finished;
    state["steps"] counts the steps begun with a row unfinished: generate's number of steps."""
    rows, device = len(prompt_input_ids), prompt_input_ids.device
    state = {name: torch.zeros(shape, dtype=torch.long, device=device) for name, shape in (
        ("token", (rows, 1)), ("position", (rows, 1)), ("cache_position", 1), ("column", 1),
        ("unfinished", rows), ("steps", ()), ("completion", (rows, max_new_tokens)))}
    state["key_mask"] = torch.zeros(rows, cache.layers[0].max_cache_len, dtype=torch.bool,
                                    device=device)
    begin(state, prompt_input_ids, prompt_mask, pad_id)
    eos = torch.as_tensor(eos_id, device=device).reshape(-1)
    sample = token_sampler(generate_kwargs)
    mask_dtype = model.get_input_embeddings().weight.dtype  # generate's eager mask: the embeddings'
    additive = model.config._attn_implementation == "eager"
    forward = {kv_cache.cache_name(model): cache, "use_cache": True}
    if "cache_position" in inspect.signature(model.forward).parameters:  # before transformers 5.x
        forward["cache_position"] = state["cache_position"]

    @torch.no_grad()
    def step():
        state["key_mask"].index_fill_(1, state["cache_position"], True)
        mask = state["key_mask"][:, None, None, :]
        if additive:
            mask = torch.zeros(mask.shape, dtype=mask_dtype, device=device).masked_fill(
                ~mask, torch.finfo(mask_dtype).min)
        with packed_heads():
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


def begin(state, prompt_input_ids, prompt_mask, pad_id):
    """decode_step's state set in place for a call on these prompts: the tensors a kept CUDA
    graph reads."""
    width = prompt_input_ids.shape[1]
    state["token"].copy_(prompt_input_ids[:, -1:])
    state["position"].copy_(prompt_mask.long().sum(dim=1, keepdim=True) - 1)  # generate's
    for name, value in (("cache_position", width - 1), ("column", 0), ("steps", 0),
                        ("unfinished", 1), ("completion", pad_id), ("key_mask", False)):
        state[name].fill_(value)
    state["key_mask"][:, :width] = prompt_mask.bool()


def packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' sdpa attention of the step's one-token query, its grouped query heads packed
    on their key/value heads ([B, H, 1, D] as [B, KV, H/KV, D]) as transformers 5.25 does; 5.17
    copies the whole cache H/KV times instead (repeat_kv: at Qwen2.5-0.5B's attention, 128 rows,
    cache 320, 738 MB written per layer and step against 4.1: benchmarks/decode_ops.py)."""
    rows, heads, _, dim = query.shape
    output = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(rows, key.shape[1], heads // key.shape[1], dim), key, value,
        attn_mask=attention_mask, dropout_p=dropout, scale=scaling)
    return output.reshape(rows, heads, 1, -1).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def packed_heads():
    """transformers' shared attention registry reads "sdpa" as packed_sdpa while the step runs."""
    saved = dict(ATTENTION._local_mapping)
    ATTENTION["sdpa"] = packed_sdpa
    try:
        yield
    finally:
        ATTENTION._local_mapping = saved


def decode_loop(model, cache, prompt_input_ids, prompt_mask, *, max_new_tokens, pad_id, eos_id,
                generate_kwargs, stop_check_every, capture=True):
    """completion ids [rows, T'] of generate's sampling loop, token for token under a seed, from
    decode_step run max_new_tokens times at most: on CUDA the shape's first step eager, then
    captured (cuda_graph) and replayed in this call and the next ones (step, state and graphs
    kept on the cache: one per shape); elsewhere eager. prompt_input_ids, prompt_mask [rows, P],
    left-padded; cache: the static cache holding their first P-1 positions.

    The host reads the device once every stop_check_every steps. generate stops at the step where
    the last row finished, so the loop may run up to stop_check_every - 1 steps more: they write
    pad into finished rows, their columns are cut (T' = generate's steps), and their random draws
    undone (the generator set back to before the block, the counted steps' draws drawn again)."""
    key = (max_new_tokens, pad_id, str(eos_id), tuple(sorted(generate_kwargs.items())),
           model.config._attn_implementation)
    kept = cache.__dict__.get("decode_loop")
    if kept is None or kept["key"] != key:
        step, state = decode_step(model, cache, prompt_input_ids, prompt_mask,
                                  max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
                                  generate_kwargs=generate_kwargs)
        kept = cache.decode_loop = dict(key=key, step=step, state=state, graphs=None)
    else:
        begin(kept["state"], prompt_input_ids, prompt_mask, pad_id)
    state, device, first = kept["state"], prompt_input_ids.device, True
    sampled = bool(generate_kwargs.get("do_sample"))
    for start in range(0, max_new_tokens, stop_check_every):
        end = min(start + stop_check_every, max_new_tokens)
        before = rng_state(device) if sampled else None
        for _ in range(start, end):
            if capture and kept["graphs"] is not None:  # a call's first replay casts the weights
                kept["graphs"][0 if first else 1]()
                first = False
            elif capture and graphs_on(device):  # the shape's first step eager, then captured
                kept["graphs"] = cuda_graph(kept["step"], device)
            else:
                kept["step"]()
        # the stop check, the loop's one blocking read: -1 while a row is unfinished, else the
        # steps generate ran (an extra block of pad steps only where a row ended inside this one)
        steps = int(torch.where(state["unfinished"].any(), -1, state["steps"]))
        if steps >= 0:
            if before is not None and steps < end:  # the block's extra draws undone
                redraw(device, before, steps - start, state["scores_shape"])
            return state["completion"][:, :steps].clone()
    return state["completion"].clone()


def graphs_on(device):
    """Whether decode_loop captures its step: on CUDA devices."""
    return device.type == "cuda"


def rng_state(device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def set_rng_state(device, state):
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def redraw(device, state, draws, shape):
    """The default generator of `device` set back to `state`, then `draws` steps' random numbers
    drawn again (token_sampler's exponential noise of `shape`, float32)."""
    set_rng_state(device, state)
    for _ in range(draws):
        torch.empty(shape, dtype=torch.float32, device=device).exponential_(1)


def cuda_graph(step, device, cuda=torch.cuda):
    """step() run once eagerly (on a side stream, as torch.cuda.graphs asks of a warm-up) -> two
    CUDA graphs of it, replayed one host call a token: (a call's first step, every next step).
    Under autocast the first also casts the weights (captured with autocast's cache emptied, the
    copies land in its pool: each call casts the weights as the update left them); the second,
    captured in the same pool, reads those copies. Random numbers: the default CUDA generator,
    registered with every graph (philox offset advanced at each replay: other draws each replay,
    as eager steps). `cuda`: torch.cuda or a stand-in (tests/test_fast_decode_loop.py)."""
    stream = cuda.Stream(device)
    stream.wait_stream(cuda.current_stream(device))
    with cuda.stream(stream):
        step()
    cuda.current_stream(device).wait_stream(stream)
    torch.clear_autocast_cache()
    first, then = cuda.CUDAGraph(), cuda.CUDAGraph()
    with cuda.graph(first):
        step()  # recorded, not run
    with cuda.graph(then, pool=first.pool()):
        step()
    return first.replay, then.replay
