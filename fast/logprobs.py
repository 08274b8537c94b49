"""The fast path of rollout.token_logprobs: the same log-probabilities, less memory and compute.

rollout.token_logprobs shows the definition: one forward, `log_softmax(logits / temperature)`,
gather the sampled tokens. Done literally, that holds the float32 logits of every completion token
at once ([B, T, V], B*T*V*4 bytes: gigabytes for a few rows of 1 024 tokens on a 150k vocabulary)
and runs each group's prompt through the model M times. This file removes both costs without
changing the numbers (tests/test_rollout.py checks values and gradients against the plain path):

  1. the shared-prompt forward: rows with the same prompt compute its KV cache once
     (completion_features, on fast/kv_cache.py's shared_prompt_cache);
  2. the chunked float32 head: the LM head and the log-softmax run on `logit_chunk` tokens at a
     time, each chunk checkpointed under autograd (chunk_logprobs, chunked_logprobs), except on
     CUDA a micro-batch of at most WHOLE_HEAD_CHUNKS chunks' tokens: one chunk, no recompute
     (head_tokens_at_once; harness/memory.py plans the same);
  3. precision: the head's logits in float32 under autocast (fp32_head), on TF32 tensor cores on
     CUDA only under a 16-bit autocast body (head_matmul), the body optionally outside autocast.

Plus what makes these safe on any HF causal LM: models that rescale their logits after the head keep
their own forward (has_plain_lm_head), and a transformers-version shim (activation_checkpointing).
Numbers: benchmarks/logprob_memory.py (memory by logit_chunk), benchmarks/logprob_fidelity.py
(precision). This file does not import rollout.
"""
import collections
import contextlib

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from fast.kv_cache import cache_name, shared_prompt_cache


def activation_checkpointing(model):
    """True when this forward will checkpoint activations (HF then drops the KV cache): only under
    autograd. Its flag: `is_activation_checkpointing` (transformers 5.x), or `..._gradient_...`."""
    flag = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"
    return torch.is_grad_enabled() and getattr(model, flag, False)


# --------------------------------------------------------------------------------------------------
# The forward: what scores each completion token (hidden states for a plain head, else logits)
# --------------------------------------------------------------------------------------------------
# Gemma 2, Cohere, Granite
LOGIT_RESCALING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def has_plain_lm_head(model):
    """True when the model's logits are exactly lm_head(last hidden state): Llama, Qwen, Mistral,
    SmolLM, ... Models that rescale or soft-cap them after the head (LOGIT_RESCALING) are scored
    through their own forward (token_logprobs' fallback): nothing here re-implements them."""
    config = model.config.get_text_config()
    return not any(getattr(config, name, None) is not None for name in LOGIT_RESCALING)


def completion_features(model, input_ids, attention_mask, width, plain_head, share_prompts):
    """What scores each row's last `width` tokens: [b, T, H] last hidden states (plain head) or
    [b, T, V] logits.

    input_ids, attention_mask [b, P+T]. Column P+t is predicted from position P+t-1: the features
    are those of positions P-1 .. P+T-2. share_prompts: rows that repeat a prompt (a group's M)
    compute its KV cache once, with gradients, and each row runs only its T positions on it
    (fast/kv_cache.py; Prefix Grouper's "shared-prefix forward", Liu et al. 2025): the same keys and
    values, so the same values up to rounding, the prompt's forward and backward M-fold smaller
    (with dropout > 0 a group shares one draw over the prompt). Not under activation checkpointing
    (HF drops the cache). Positions as HF generate's with left padding: real tokens before, >= 0.
    """
    prompt_width = input_ids.shape[1] - width
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    body = model.get_decoder() if plain_head else model  # the plain head runs later, in chunks
    cache = None
    if share_prompts and prompt_width > 1 and not activation_checkpointing(model):
        cache = shared_prompt_cache(model, input_ids, attention_mask, prompt_width)
    if cache is None:  # the plain forward over all P+T columns
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    else:  # columns P-1 .. P+T-2 on top of the prompts' cache (which holds columns 0 .. P-2)
        inputs = dict(input_ids=input_ids[:, prompt_width - 1:-1],
                      attention_mask=attention_mask[:, :-1],
                      position_ids=position_ids[:, prompt_width - 1:-1],
                      **{cache_name(body): cache})
    output = body(**inputs, use_cache=cache is not None,
                  **({} if plain_head else dict(logits_to_keep=width + 1)))
    features = output.last_hidden_state if plain_head else output.logits  # logits: the model's own
    return features[:, -width - 1:-1] if cache is None else features  # cache: T columns


def body_precision(device_type, body_autocast):
    """Context for the forward: as the caller set it (body_autocast=True), or autocast off (the
    weights' dtype: autocast re-rounds fp32 weights to bf16 at each forward, so a tiny update moves
    some by a whole bf16 step, noise the ratio after an update carries)."""
    return contextlib.nullcontext() if body_autocast else torch.autocast(device_type, enabled=False)


# --------------------------------------------------------------------------------------------------
# The head: float32 logits on tensor cores, a chunk of tokens at a time
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def fp32_matmuls(tf32):
    """CUDA float32 matmuls on TF32 tensor cores (operands cut to 10 mantissa bits) or IEEE inside
    the block only, torch's setting restored exactly after: fp32_precision on torch >= 2.9 (where
    reading allow_tf32 raises once anything set it), else allow_tf32. A CPU has no TF32."""
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    previous = getattr(matmul, name)
    setattr(matmul, name, ("tf32" if tf32 else "ieee") if name == "fp32_precision" else tf32)
    try:
        yield
    finally:
        setattr(matmul, name, previous)


class TensorCoreHead(torch.autograd.Function):
    """logits = features @ weight^T [n, V] float32, under fp32_matmuls(tf32) in the forward and both
    backward matmuls (which run later, outside any context around the call). TF32 over bf16
    operands: benchmarks/logprob_fidelity.py's rows (lab/results/logprob_fidelity.csv)."""
    @staticmethod
    def forward(ctx, features, weight, tf32):
        ctx.save_for_backward(features, weight)
        ctx.tf32 = tf32
        with fp32_matmuls(tf32):
            return features @ weight.T

    @staticmethod
    def backward(ctx, grad_logits):
        features, weight = ctx.saved_tensors
        with fp32_matmuls(ctx.tf32):
            grad_features = grad_logits @ weight if ctx.needs_input_grad[0] else None
            grad_weight = grad_logits.T @ features if ctx.needs_input_grad[1] else None
        return grad_features, grad_weight, None


def head_matmul(features, weight, tf32):
    """[n, H] float32 features x the [V, H] float32 head -> [n, V] float32 logits: on CUDA
    TensorCoreHead (TF32 or IEEE), elsewhere the exact float32 matmul."""
    cuda = features.device.type == "cuda"
    return TensorCoreHead.apply(features, weight, tf32) if cuda else F.linear(features, weight)


def float32_logits(model, plain_head, fp32_head, tf32):
    """-> to_logits: [n, H] hidden states (or [n, V] logits of the fallback) -> [n, V] float32
    logits.

    fp32_head: float32 logits even under autocast (bf16 rounds a logit of 16 by up to 0.06), from
    float32 operands with float32 accumulation (head_matmul; tf32: on TF32 tensor cores on CUDA);
    False: the head in the autocast dtype, its logits cast to float32 after."""
    if not plain_head:  # the model's own logits (see has_plain_lm_head)
        return lambda features: features.float()
    head = model.get_output_embeddings()
    if not fp32_head:
        return lambda features: head(features).float()
    weight, bias = head.weight.float(), None if head.bias is None else head.bias.float()

    def to_logits(features):
        with torch.autocast(features.device.type, enabled=False):
            logits = head_matmul(features.float(), weight, tf32)
            return logits if bias is None else logits + bias
    return to_logits


def chunk_logprobs(features, targets, to_logits, temperature, with_entropy):
    """features [n, H or V], targets [n] -> (log p of targets [n], entropy [n] or None), via
    float32 logits [n, V].

    Exact: log p = logit[token] - logsumexp(logits), per token (no divide at temperature 1); the
    entropy is detached (a metric)."""
    logits = to_logits(features)
    if temperature != 1:
        logits = logits / temperature
    log_normalizer = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - log_normalizer
    if not with_entropy:
        return logprobs, None
    with torch.no_grad():
        entropy = log_normalizer - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return logprobs, entropy


WHOLE_HEAD_CHUNKS = 4  # on CUDA, a micro-batch of up to 4 logit chunks' tokens: one chunk
HEAD_BRANCHES = collections.Counter()  # head forwards by branch ("one chunk" or "chunks") taken


def head_tokens_at_once(tokens, device_type, logit_chunk):
    """Tokens whose float32 logits the head makes at once: on CUDA all of a micro-batch's (no
    recompute) up to WHOLE_HEAD_CHUNKS * logit_chunk, on any card (harness/memory.py plans it);
    else logit_chunk."""
    whole = device_type == "cuda" and tokens <= WHOLE_HEAD_CHUNKS * logit_chunk
    return tokens if whole else logit_chunk


def chunked_logprobs(features, targets, to_logits, temperature, with_entropy, logit_chunk):
    """features [b, T, H or V], targets [b, T] -> (log-probs [b, T], entropy [b, T] or None),
    logit_chunk tokens at a time: the float32 logits held at once are [logit_chunk, V] (about
    logit_chunk * V * 4 bytes, times ~3 for the log-softmax and entropy temporaries), whatever b and
    T.

    With gradients and several chunks, each chunk is checkpointed: its logits are recomputed in
    backward instead of being kept (one more LM-head matmul per chunk)."""
    rows, width = targets.shape
    flat_features, flat_targets = features.reshape(rows * width, -1), targets.reshape(-1)
    checkpointed = torch.is_grad_enabled() and flat_features.shape[0] > logit_chunk
    pieces = []
    for first in range(0, flat_features.shape[0], logit_chunk):
        args = (flat_features[first:first + logit_chunk], flat_targets[first:first + logit_chunk],
                to_logits, temperature, with_entropy)
        pieces.append(torch.utils.checkpoint.checkpoint(chunk_logprobs, *args, use_reentrant=False)
                      if checkpointed else chunk_logprobs(*args))
    logprobs = torch.cat([lp for lp, _ in pieces]).view(rows, width)
    entropy = torch.cat([ent for _, ent in pieces]).view(rows, width) if with_entropy else None
    return logprobs, entropy


# --------------------------------------------------------------------------------------------------
# token_logprobs, fast: micro-batches of rows -> shared-prompt forward -> chunked float32 head
# --------------------------------------------------------------------------------------------------
def token_logprobs(model, input_ids, attention_mask, completion_mask, *, temperature, micro_batch,
                   with_entropy, logit_chunk, fp32_head, body_autocast, share_prompts):
    """rollout.token_logprobs' fast path (its docstring has the arguments and defaults).

    input_ids, attention_mask [B, P+T]; completion_mask [B, T] (only its width T is used) ->
    log-probs [B, T] float32, and the detached entropy [B, T] when with_entropy. Rows go through
    the model `micro_batch` at a time, then the head (head_tokens_at_once, chunked_logprobs)."""
    width = completion_mask.shape[1]
    if input_ids.shape[0] == 0:  # no rows: empty results of the right shape
        empty = torch.zeros((0, width), device=input_ids.device)
        return (empty, empty) if with_entropy else empty
    micro_batch = micro_batch or input_ids.shape[0]
    plain_head = has_plain_lm_head(model)  # else: the model's own logits, no chunked head of ours
    # TF32 only under an autocast body: --dtype fp32, --logprob-fp32 keep an IEEE float32 head
    tf32 = body_autocast and torch.is_autocast_enabled(input_ids.device.type)
    to_logits = float32_logits(model, plain_head, fp32_head, tf32)
    logprob_parts, entropy_parts = [], []
    for start in range(0, input_ids.shape[0], micro_batch):
        ids = input_ids[start:start + micro_batch]
        mask = attention_mask[start:start + micro_batch]
        with body_precision(ids.device.type, body_autocast):  # [b, T, H or V]
            features = completion_features(model, ids, mask, width, plain_head, share_prompts)
        tokens = ids.shape[0] * width  # features[:, t] (position P+t-1) scores ids[:, P+t]
        chunk = head_tokens_at_once(tokens, ids.device.type, logit_chunk)
        HEAD_BRANCHES["one chunk" if chunk >= tokens else "chunks"] += 1
        logprobs, entropy = chunked_logprobs(features, ids[:, -width:], to_logits, temperature,
                                             with_entropy, chunk)
        logprob_parts.append(logprobs)
        entropy_parts.append(entropy)
    logprobs = torch.cat(logprob_parts)
    return (logprobs, torch.cat(entropy_parts).detach()) if with_entropy else logprobs
