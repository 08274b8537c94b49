"""Rollouts with Hugging Face `generate`, and the log-probabilities of the sampled tokens (DESIGN.md
section 5).

Layout used everywhere in this repo: a batch row is [left-padded prompt | completion], the
completion being the last T columns. `completion_mask` [B, T] marks the generated tokens up to and
including the first EOS; the log-prob tensors [B, T] line up with it column for column.
"""
import contextlib
import functools
import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from fast.generate import generate_options, self_check
from fast.kv_cache import cache_name, prefill_prompt_cache
from fast.logprobs import token_logprobs as fast_token_logprobs


# --------------------------------------------------------------------------------------------------
# Prompts: chat template for instruct models, plain text otherwise
# --------------------------------------------------------------------------------------------------
def render_prompts(tokenizer, task, examples, style):
    """Token ids of each example's prompt (list of lists of ints, no padding).

    style "compact": the task's one-line prompt; the tokenizer adds its own BOS (the tiny char
    tokenizer does).
    style "chat": the task's messages through the tokenizer's chat template with the generation
    prompt, then the task's assistant_prefill (see there). A tokenizer without a template
    (a base model) gets plain_text_conversation (harness/run.py notes it once per run),
    then " " and the prefill. An example that carries its prompt already rendered (a data file
    whose one message is the whole templated text, as AR-Lopti's K&K and Countdown files are:
    example["rendered_prompt"]) is tokenized as it is, the way those runs fed it to the tokenizer.
    """
    if style == "chat" and any("rendered_prompt" in ex for ex in examples):
        return [tokenizer(ex["rendered_prompt"], add_special_tokens=False)["input_ids"]
                if "rendered_prompt" in ex else render_prompts(tokenizer, task, [ex], style)[0]
                for ex in examples]
    if style == "compact":
        return [tokenizer(task.prompt(ex, "compact"))["input_ids"] for ex in examples]
    if style != "chat":
        raise ValueError(f"prompt style must be 'chat' or 'compact', got {style!r}")
    prefill = assistant_prefill(task)
    if not getattr(tokenizer, "chat_template", None):
        # "Assistant: <think>", as the R1-Zero-style base-model prompts
        after = " " + prefill if prefill else ""
        return [tokenizer(plain_text_conversation(task.prompt(ex, "chat")) + after)["input_ids"]
                for ex in examples]
    texts = [tokenizer.apply_chat_template(task.prompt(ex, "chat"),
                                           add_generation_prompt=True, tokenize=False)
             + prefill for ex in examples]
    return [tokenizer(t, add_special_tokens=False)["input_ids"]
            for t in texts]  # the template has its own BOS


def assistant_prefill(task):
    """The text a task's chat prompt puts at the start of the assistant's turn,
    after the generation prompt: the task's optional `assistant_prefill` attribute
    (a string; "" or absent: none). The model writes its completion after it,
    and the completion alone reaches task.reward, so the task scores it knowing its own prefill
    (knights_knaves with think_prefill=true: "<think>", as the official K&K prompts end)."""
    prefill = getattr(task, "assistant_prefill", "") or ""
    if not isinstance(prefill, str):
        raise TypeError(
            f"task {getattr(task, 'name', task)!r}: assistant_prefill must be a string, "
            f"got {type(prefill).__name__}")
    return prefill


def plain_text_conversation(messages):
    """The prompt a base model without a chat template gets, in the form of the
    R1-Zero-style base-model runs (TinyZero, Logic-RL): a line naming the conversation,
    the system text (the tasks' asks for <think> reasoning and an <answer>), "User: ..."
    and "Assistant: ..." turns, ending with "Assistant:" for the model to continue."""
    system = " ".join(m["content"] for m in messages if m["role"] == "system")
    turns = [f"{'Assistant' if m['role'] == 'assistant' else 'User'}: {m['content']}"
             for m in messages if m["role"] != "system"]
    return "\n".join([f"A conversation between User and Assistant. {system}".rstrip(),
                      *turns, "Assistant:"])


def left_pad(prompt_ids, pad_token_id):
    """list of P_i-long id lists -> (input_ids [N, P], attention_mask [N, P])
    with padding on the left."""
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


# --------------------------------------------------------------------------------------------------
# Completion mask: every generated token up to and including the first EOS
# --------------------------------------------------------------------------------------------------
def completion_mask_from_ids(completion_ids, eos_token_id):
    """completion_ids [B, T] -> (completion_mask [B, T] float 0/1, truncated [B] bool).

    A row's mask covers columns 0..e where e is its first EOS (kept: the model must learn to stop);
    a row with no EOS is truncated and keeps all T columns. Works when pad == eos:
    generate pads finished rows with the pad id, and only the first EOS counts.
    eos_token_id: an int or a list of ints (several stop tokens).
    """
    eos_ids = torch.as_tensor(eos_token_id if isinstance(eos_token_id, (list, tuple))
                              else [eos_token_id], device=completion_ids.device)
    is_eos = torch.isin(completion_ids, eos_ids)
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), completion_ids.shape[1] - 1)
    columns = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    completion_mask = (columns[None, :] <= first_eos[:, None]).float()
    return completion_mask, ~has_eos


GREEDY = dict(do_sample=False, temperature=None, top_p=None, top_k=None)  # plain argmax


@dataclass
class Rollouts:
    input_ids: torch.Tensor        # [B, P+T] left-padded prompt, then completion
                                   # (B = num_prompts * M)
    attention_mask: torch.Tensor   # [B, P+T] prompt padding and post-EOS padding are 0
    completion_mask: torch.Tensor  # [B, T] float 0/1, the tokens the loss sees
    truncated: torch.Tensor        # [B] bool, no EOS within max_new_tokens
    prompt_index: torch.Tensor     # [B] long, row -> index into the prompt list
                                   # (rows of a group are adjacent)
    completions: list              # [B] decoded completion text (special tokens dropped)


def sample_completions(model, prompt_ids, num_generations, *, pad_id, eos_id, max_new_tokens,
                       share_prefill, drop_finished_every, generate_kwargs, fast=True,
                       compiled=False):
    """HF generate for all rows of `prompt_ids` ->
    (prompt ids [N*M, P], prompt mask, completion ids [N*M, T]).

    drop_finished_every: generate that many tokens at a time, then take the rows that reached EOS
    (and their KV cache) out of the batch before going on; a single generate call keeps decoding
    finished rows until the last row stops. None: one generate call for all max_new_tokens.
    fast=False: the plain generate call. fast=True: the same completions, token for token, in less
    time (fast/generate.py): each prompt prefilled once for its M rows (share_prefill), into a KV
    cache written in place; compiled: a static KV cache and a compiled decode step.
    """
    if compiled and drop_finished_every:
        raise ValueError("fast generate keeps every row in its static cache: "
                         "no drop_finished_every")
    device = next(model.parameters()).device
    prompt_input_ids, prompt_mask = (t.to(device) for t in left_pad(prompt_ids, pad_id))
    cache = None  # the plain call: generate makes its own DynamicCache
    if fast and share_prefill and num_generations > 1 and prompt_input_ids.shape[1] > 1:
        row_prompt = torch.arange(len(prompt_input_ids),
                                  device=device).repeat_interleave(num_generations)
        cache = prefill_prompt_cache(model, prompt_input_ids, prompt_mask, row_prompt)
    prompt_input_ids = prompt_input_ids.repeat_interleave(num_generations, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    completion_ids = torch.full((len(prompt_input_ids), max_new_tokens), pad_id, device=device)
    running = torch.arange(len(prompt_input_ids), device=device)  # rows still decoding
    input_ids, attention_mask, width = prompt_input_ids, prompt_mask, 0
    while True:
        segment = min(drop_finished_every or max_new_tokens, max_new_tokens - width)
        cache_options = {cache_name(model): cache}  # None: generate makes its own
        if fast:  # the same completions, less time a token: fast/generate.py
            cache_options = generate_options(model, cache, len(input_ids), input_ids.shape[1],
                                             max_new_tokens - width, compiled)
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                **cache_options, max_new_tokens=segment,
                                pad_token_id=pad_id, eos_token_id=eos_id,
                                return_dict_in_generate=True, **generate_kwargs)
        new_ids = output.sequences[:, input_ids.shape[1]:]
        completion_ids[running, width:width + new_ids.shape[1]] = new_ids
        width += new_ids.shape[1]
        going = ~torch.isin(new_ids, torch.tensor(eos_id, device=device)).any(dim=1)
        # done: all max_new_tokens, or every row stopped
        # (the only reason generate returns short of `segment`)
        if width == max_new_tokens or new_ids.shape[1] < segment or not going.any():
            return prompt_input_ids, prompt_mask, completion_ids[:, :width]
        # the unfinished rows go on from their sequences so far;
        # the cache holds all but their last token
        running, input_ids = running[going], output.sequences[going]
        attention_mask = torch.cat([attention_mask, torch.ones_like(new_ids)], dim=1)[going]
        cache = getattr(output, cache_name(model))
        cache.batch_select_indices(going.nonzero().squeeze(1))


@torch.no_grad()
def generate_rollouts(model, tokenizer, prompt_ids, num_generations, *, max_new_tokens,
                      temperature=1.0, top_p=1.0, greedy=False, mask_truncated=False,
                      share_prefill=True, rollout_batch=None, drop_finished_every=None,
                      fast=True, fast_generate=False):
    """Sample `num_generations` (M) completions for each prompt with HF generate; returns Rollouts.

    prompt_ids: list of token-id lists (see render_prompts). Sampling is plain ancestral sampling
    at `temperature` (top_k off, no repetition penalty), so p_old = softmax(logits / temperature)
    up to top_p; greedy=True is plain argmax. Nothing else from the model folder's
    generation_config.json applies (its min_new_tokens, no_repeat_ngram_size, min_p, num_beams, ...
    would sample from another distribution than the one the PPO ratio assumes). Randomness comes
    from torch's global RNG: seed with torch.manual_seed for reproducible rollouts.
    mask_truncated: zero the completion mask of rows that hit max_new_tokens without an EOS.
    share_prefill: run each prompt through the model once and copy its KV cache to
    its M rows (same samples, less compute; see prefill_prompt_cache). rollout_batch:
    at most this many rows per generate call (whole groups, at least one group per call)
    to bound generate's memory; None = all rows in one call. The calls' results are joined
    with the usual layout: prompts left-padded to the widest, completions right-padded.
    drop_finished_every: stop decoding rows that reached EOS every
    that many tokens (see sample_completions); the same distribution,
    but other random draws than one call (fewer rows per sampling step).
    fast=False: the plain generate call (see sample_completions; share_prefill is then off). At the
    first rollout on a CUDA device, fast/generate.py's self_check holds the fast paths to it on two
    rows and falls back to it on a difference.
    fast_generate: a static KV cache and a compiled decode step in the same generate call (the same
    samples up to float rounding; compiled once per run and shape: see fast/generate.py).
    """
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    eos_id = model.generation_config.eos_token_id
    eos_id = eos_id if eos_id is not None else tokenizer.eos_token_id
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) \
        if not greedy else GREEDY
    generate_kwargs = dict(repetition_penalty=1.0, **sampling)
    prompts_per_call = len(prompt_ids) if rollout_batch is None \
        else max(1, rollout_batch // num_generations)
    was_training, folder_config = model.training, model.generation_config
    model.eval()
    # generate fills every setting not given here from model.generation_config: a blank one instead
    model.generation_config = GenerationConfig(pad_token_id=pad_id, eos_token_id=eos_id,
                                               bos_token_id=folder_config.bos_token_id)
    try:
        if fast:  # once, on a device the fast paths were never tested on: the same tokens, or plain
            fast = self_check(model, functools.partial(
                sample_completions, model, prompt_ids[:1], 2, pad_id=pad_id, eos_id=eos_id,
                share_prefill=share_prefill, drop_finished_every=None,
                generate_kwargs=dict(repetition_penalty=1.0, **GREEDY)), fast_generate)
        parts = [sample_completions(model, prompt_ids[start:start + prompts_per_call],
                                    num_generations, pad_id=pad_id, eos_id=eos_id,
                                    max_new_tokens=max_new_tokens, share_prefill=share_prefill,
                                    drop_finished_every=drop_finished_every,
                                    generate_kwargs=generate_kwargs, fast=fast,
                                    compiled=fast and fast_generate)
                 for start in range(0, len(prompt_ids), prompts_per_call)]
    finally:
        model.train(was_training)
        model.generation_config = folder_config
    prompt_width = max(p.shape[1] for p, _, _ in parts)
    completion_width = max(c.shape[1] for _, _, c in parts)
    # Join the calls. Right-padding a completion with pad_id is what
    # generate does to rows that finished early; only a call that ran all
    # max_new_tokens can hold rows without EOS, and it is already the widest.
    prompt_input_ids = torch.cat([F.pad(p, (prompt_width - p.shape[1], 0), value=pad_id)
                                  for p, _, _ in parts])
    prompt_mask = torch.cat([F.pad(m, (prompt_width - m.shape[1], 0), value=0)
                             for _, m, _ in parts])
    completion_ids = torch.cat([F.pad(c, (0, completion_width - c.shape[1]), value=pad_id)
                                for _, _, c in parts])
    completion_mask, truncated = completion_mask_from_ids(completion_ids, eos_id)
    completions = tokenizer.batch_decode(completion_ids.masked_fill(completion_mask == 0, pad_id),
                                         skip_special_tokens=True)
    if mask_truncated:  # still rewarded (they shape the group baseline), but never trained on
        completion_mask = completion_mask * (~truncated)[:, None].float()
    return Rollouts(input_ids=torch.cat([prompt_input_ids, completion_ids], dim=1),
                    attention_mask=torch.cat([prompt_mask, completion_mask.long()], dim=1),
                    completion_mask=completion_mask, truncated=truncated,
                    prompt_index=torch.arange(len(prompt_ids)).repeat_interleave(num_generations),
                    completions=completions)


# --------------------------------------------------------------------------------------------------
# Log-probabilities of the sampled tokens: the definition here,
# the fast path (same numbers) in fast/logprobs.py
# --------------------------------------------------------------------------------------------------
def token_logprobs(model, input_ids, attention_mask, completion_mask, *, temperature=1.0,
                   micro_batch=None, with_entropy=False, fast=True, logit_chunk=1024,
                   fp32_head=True, body_autocast=True, share_prompts=True):
    """log pi(o_t | o_<t) of the completion tokens under logits / temperature -> [B, T] float32.

    input_ids, attention_mask [B, P+T]; completion_mask [B, T] (only its width T is used here:
    the completion is the last T columns). Gradients flow unless called under torch.no_grad().
    with_entropy=True also returns the per-token entropy [B, T] of softmax(logits / temperature),
    detached (a metric). micro_batch: rows per forward (None: all). Positions follow
    HF generate with left padding: position_id = (number of real tokens before)
    clipped at 0, so each token is scored exactly as generate sampled it.
    body_autocast=False runs the forward outside autocast,
    in the weights' dtype (float32 in train.py).
    fast=True (default): fast/logprobs.py's token_logprobs, the same values up to float rounding
    with less memory and compute: each group's prompt runs through the model once (share_prompts),
    the LM head and log-softmax run in float32 (fp32_head, even under autocast)
    on `logit_chunk` tokens at a time. Numbers: benchmarks/logprob_memory.py
    (memory by logit_chunk), benchmarks/logprob_fidelity.py (bf16 precision).
    fast=False: the plain path below, the definition
    (the tests' reference); it ignores those three options.
    """
    if fast:  # same numbers, less memory and compute: see fast/logprobs.py
        return fast_token_logprobs(
            model, input_ids, attention_mask, completion_mask, temperature=temperature,
            micro_batch=micro_batch, with_entropy=with_entropy, logit_chunk=logit_chunk,
            fp32_head=fp32_head, body_autocast=body_autocast, share_prompts=share_prompts)
    # Plain path: no logit chunking (holds [b, T, V] float32 logits),
    # no prompt sharing, the model's own head.
    T = completion_mask.shape[1]
    micro_batch = micro_batch or input_ids.shape[0]
    logprob_parts, entropy_parts = [], []
    for start in range(0, input_ids.shape[0], micro_batch):
        ids, mask = input_ids[start:start + micro_batch], attention_mask[start:start + micro_batch]
        # real tokens before; 0 on the left padding
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        with contextlib.nullcontext() if body_autocast \
                else torch.autocast(ids.device.type, enabled=False):
            logits = model(input_ids=ids, attention_mask=mask,
                           position_ids=position_ids).logits  # [b, P+T, V]
        logits = logits[:, -T - 1:-1]  # position P+t-1 predicts the token at column P+t
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [b, T, V]
        logprob_parts.append(logp_all.gather(-1, ids[:, -T:, None]).squeeze(-1))  # [b, T]
        if with_entropy:
            entropy_parts.append(
                -(logp_all.exp() * logp_all).sum(dim=-1).detach())  # -sum_v p log p
    logprobs = torch.cat(logprob_parts)
    return (logprobs, torch.cat(entropy_parts)) if with_entropy else logprobs


# --------------------------------------------------------------------------------------------------
# Held-out evaluation: greedy pass@1 and mean reward
# --------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, tokenizer, task, examples, *, style, max_new_tokens,
             batch_size=256, samples=None, fast=True):
    """Greedy decoding on held-out examples -> {"pass@1", "reward", "length",
    "pass@1_se", "reward_se"} (python floats; _se: standard errors over the examples).

    pass@1: share of examples whose greedy completion has reward >= task.pass_threshold.
    samples: a list that receives (completion, reward) of every example,
    to show a few (harness/run.py prints some at each eval). fast: as in generate_rollouts.
    """
    rewards, lengths, completions = [], [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        rollouts = generate_rollouts(model, tokenizer,
                                     render_prompts(tokenizer, task, chunk, style), 1,
                                     max_new_tokens=max_new_tokens, greedy=True, fast=fast)
        rewards += [float(task.reward(text, ex, style=style))
                    for text, ex in zip(rollouts.completions, chunk)]
        lengths += rollouts.completion_mask.sum(dim=1).tolist()
        completions += rollouts.completions
    if not all(map(math.isfinite, rewards)):  # else the standard errors below are a NaN traceback
        bad = next(text for text, r in zip(completions, rewards) if not math.isfinite(r))
        raise ValueError(f"task {task.name!r} returned a non-finite reward for the completion "
                         f"{bad!r}")
    if samples is not None:
        samples.extend(zip(completions, rewards))
    passed = [float(r >= task.pass_threshold) for r in rewards]

    # over the held-out prompts: what a before/after gain is read against
    def standard_error(values):
        return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return {"pass@1": statistics.fmean(passed), "reward": statistics.fmean(rewards),
            "length": statistics.fmean(lengths), "pass@1_se": standard_error(passed),
            "reward_se": standard_error(rewards)}
