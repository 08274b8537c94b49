"""Rollouts with Hugging Face `generate`, and the log-probabilities of the sampled tokens (DESIGN.md
section 5).

Layout used everywhere in this repo: a batch row is [left-padded prompt | completion], the
completion being the last T columns. `completion_mask` [B, T] marks the generated tokens up to and
including the first EOS; the log-prob tensors [B, T] line up with it column for column.
"""
import contextlib
import inspect
import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from transformers import GenerationConfig


# --------------------------------------------------------------------------------------------------
# Prompts: chat template for instruct models, plain text otherwise
# --------------------------------------------------------------------------------------------------
def render_prompts(tokenizer, task, examples, style):
    """Token ids of each example's prompt (lists of ints, no padding).

    "compact": the task's one-line prompt (the tokenizer adds its BOS). "chat": the task's messages
    through the chat template, then the task's assistant_prefill; a tokenizer without a template
    gets plain_text_conversation. An example carrying its prompt already rendered
    (example["rendered_prompt"]) is tokenized as it is.
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
    """The text the task puts at the start of the assistant's turn (its optional `assistant_prefill`
    string, e.g. "<think>"); the completion after it is what task.reward scores."""
    prefill = getattr(task, "assistant_prefill", "") or ""
    if not isinstance(prefill, str):
        raise TypeError(
            f"task {getattr(task, 'name', task)!r}: assistant_prefill must be a string, "
            f"got {type(prefill).__name__}")
    return prefill


def plain_text_conversation(messages):
    """A base model's prompt without a chat template, as the R1-Zero-style runs write it: the system
    text, "User: ..." and "Assistant: ..." turns, ending with "Assistant:"."""
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

    mask[b, t] = 1 for t <= the row's first EOS (kept: the model must learn to stop); a row without
    EOS is truncated and keeps all T. Only the first EOS counts, so pad == eos works. eos_token_id:
    int or list.
    """
    eos_ids = torch.as_tensor(eos_token_id if isinstance(eos_token_id, (list, tuple))
                              else [eos_token_id], device=completion_ids.device)
    is_eos = torch.isin(completion_ids, eos_ids)
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), completion_ids.shape[1] - 1)
    columns = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    completion_mask = (columns[None, :] <= first_eos[:, None]).float()
    return completion_mask, ~has_eos


def precision(device, dtype):
    """The forwards' compute precision (--dtype): bf16 autocast over fp32 weights ("bf16"), or
    none ("fp32")."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == "bf16" \
        else contextlib.nullcontext()


GREEDY = dict(do_sample=False, temperature=None, top_p=None, top_k=None)  # plain argmax


@dataclass
class Rollouts:
    input_ids: torch.Tensor        # [B, P+T] left-padded prompt, then completion (B = N * M)
    attention_mask: torch.Tensor   # [B, P+T] prompt padding and post-EOS padding are 0
    completion_mask: torch.Tensor  # [B, T] float 0/1, the tokens the loss sees
    truncated: torch.Tensor        # [B] bool, no EOS within max_new_tokens
    prompt_index: torch.Tensor     # [B] long, row -> its prompt's index (a group's rows adjacent)
    completions: list              # [B] decoded completion text (special tokens dropped)
    num_generations: int           # M, so rewards.view(-1, M) is [G, M]


def sample_completions(model, prompt_ids, num_generations, *, pad_id, eos_id, max_new_tokens,
                       generate_kwargs, fast_generate=False):
    """M completions of each prompt -> (prompt ids [N*M, P], prompt mask [N*M, P], completion ids
    [N*M, T]): one HF generate call on the prompts repeated M times."""
    device = next(model.parameters()).device
    prompt_input_ids, prompt_mask = (t.to(device) for t in left_pad(prompt_ids, pad_id))
    input_ids = prompt_input_ids.repeat_interleave(num_generations, dim=0)
    attention_mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    if fast_generate:  # fast/: the same tokens under a seed, one CUDA graph a token on a GPU
        from fast.generate import loop_generate
        completion_ids = loop_generate(model, input_ids, attention_mask, pad_id=pad_id,
                                       eos_id=eos_id, max_new_tokens=max_new_tokens,
                                       generate_kwargs=generate_kwargs)
        if completion_ids is not None:  # None: the loop does not hold here (it said why)
            return input_ids, attention_mask, completion_ids
    sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                               max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                               eos_token_id=eos_id, **generate_kwargs)
    return input_ids, attention_mask, sequences[:, input_ids.shape[1]:]


@torch.no_grad()
def generate_rollouts(model, tokenizer, prompt_ids, num_generations, *, max_new_tokens,
                      temperature=1.0, top_p=1.0, greedy=False, mask_truncated=False,
                      rollout_batch=None, fast_generate=False):
    """M = num_generations sampled completions of each prompt (token-id lists) -> Rollouts.

    Plain ancestral sampling at `temperature` up to top_p (top_k off, no repetition penalty, nothing
    from the model folder's generation_config.json), so p_old = softmax(logits / temperature): what
    the PPO ratio assumes. greedy: argmax. Seed with torch.manual_seed. mask_truncated: rows without
    EOS leave the loss (still rewarded). rollout_batch: at most this many rows (whole groups) per
    generate call. fast_generate: sample_completions' opt-in decode loop (DESIGN.md section 5).
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
        parts = [sample_completions(model, prompt_ids[start:start + prompts_per_call],
                                    num_generations, pad_id=pad_id, eos_id=eos_id,
                                    max_new_tokens=max_new_tokens,
                                    generate_kwargs=generate_kwargs,
                                    fast_generate=fast_generate)
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
                    completions=completions, num_generations=num_generations)


# --------------------------------------------------------------------------------------------------
# Log-probabilities of the sampled tokens: the body once, the float32 head a chunk at a time
# --------------------------------------------------------------------------------------------------
def token_logprobs(model, input_ids, attention_mask, completion_mask, *, temperature=1.0,
                   micro_batch=None, with_entropy=False, logit_chunk=1024):
    """log pi(o_t | o_<t) of the completion tokens under logits / temperature -> [B, T] float32;
    with_entropy: (log-probs, each token's entropy [B, T], detached).

    input_ids, attention_mask [B, P+T]; completion_mask [B, T] (its width T: the completion is the
    last T columns). micro_batch: rows per forward. Positions as HF generate gives them with left
    padding, so each token is scored as it was sampled. The body gives the last hidden states
    [b, T, H]; the head then runs logit_chunk tokens at a time (chunk_logprobs), so the float32
    logits [B*T, V] (gigabytes at a 150k vocabulary) never exist at once: with gradients and
    several chunks each chunk's logits are recomputed in backward instead of kept.
    """
    T = completion_mask.shape[1]
    config = model.config.get_text_config()
    rescaled = [name for name in LOGIT_RESCALING if getattr(config, name, None) is not None]
    if rescaled:
        raise ValueError(f"token_logprobs scores lm_head(hidden states); this model rescales its "
                         f"logits after the head ({rescaled[0]}): not supported")
    head = model.get_output_embeddings()
    weight, bias = head.weight.float(), None if head.bias is None else head.bias.float()
    parts = []  # (log-probs [n], entropy [n] or None) of each chunk of n tokens
    micro_batch = micro_batch or max(len(input_ids), 1)
    for start in range(0, len(input_ids), micro_batch):
        ids, mask = input_ids[start:start + micro_batch], attention_mask[start:start + micro_batch]
        hidden = completion_hidden_states(model, ids, mask, T)  # [b*T, H]
        targets = ids[:, -T:].reshape(-1)
        recompute = torch.is_grad_enabled() and len(targets) > logit_chunk
        for first in range(0, len(targets), logit_chunk):
            args = (hidden[first:first + logit_chunk], targets[first:first + logit_chunk], weight,
                    bias, temperature, with_entropy)
            checkpoint = torch.utils.checkpoint.checkpoint
            parts.append(checkpoint(chunk_logprobs, *args, use_reentrant=False) if recompute
                         else chunk_logprobs(*args))
    shape, empty = (len(input_ids), T), [torch.zeros(0, device=input_ids.device)]  # 0 rows: empty
    logprobs = torch.cat([logprobs for logprobs, _ in parts] or empty).view(shape)
    if not with_entropy:
        return logprobs
    return logprobs, torch.cat([entropy for _, entropy in parts] or empty).view(shape)


def completion_hidden_states(model, input_ids, attention_mask, T):
    """The body's last hidden states that predict the last T columns -> [b*T, H] (position P+t-1
    predicts column P+t; positions as generate's: 0 on the left padding). Rows that repeat a
    prompt (a group's M) run it once: its keys and values, with gradients, serve each row's T
    positions (the same values up to rounding, the prompt's work M-fold smaller; the plain forward
    where no two rows share one, or under activation checkpointing, which drops the cache)."""
    decoder, P = model.get_decoder(), input_ids.shape[1] - T
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    prompts, row_prompt = torch.unique(torch.cat([input_ids[:, :P], attention_mask[:, :P]], dim=1),
                                       dim=0, return_inverse=True)  # a prompt: its ids and mask
    flag = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"  # transformers 5, 4
    checkpointing = torch.is_grad_enabled() and getattr(model, flag, False)
    cache = None
    if len(prompts) < len(input_ids) and P > 1 and not checkpointing \
            and model._supports_default_dynamic_cache():  # each prompt once (not Mamba's state)
        name = "cache" if "cache" in inspect.signature(decoder.forward).parameters \
            else "past_key_values"  # the KV cache's argument and field (renamed in transformers 5)
        prompt_mask = prompts[:, P:]
        cache = getattr(decoder(input_ids=prompts[:, :P - 1], attention_mask=prompt_mask[:, :-1],
                                position_ids=(prompt_mask.cumsum(1) - 1).clamp(min=0)[:, :-1],
                                use_cache=True), name)
    if cache is None or any(getattr(cache, "is_linear", ())):  # no plain KV cache: the plain one
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids).last_hidden_state[:, -T - 1:-1]
    else:  # columns P-1 .. P+T-2 of every row on its prompt's keys and values (columns 0 .. P-2)
        cache.batch_select_indices(row_prompt)
        hidden = decoder(input_ids=input_ids[:, P - 1:-1], attention_mask=attention_mask[:, :-1],
                         position_ids=position_ids[:, P - 1:-1], use_cache=True,
                         **{name: cache}).last_hidden_state
    return hidden.reshape(-1, hidden.shape[-1])


# Gemma 2, Cohere, Granite: logits rescaled or soft-capped after the head
LOGIT_RESCALING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def chunk_logprobs(hidden, targets, weight, bias, temperature, with_entropy):
    """hidden [n, H], targets [n] -> (log p of the targets [n], entropy [n] detached or None), from
    float32 logits [n, V] = hidden W^T + b (autocast off): log p = the token's logit - logsumexp."""
    with torch.autocast(hidden.device.type, enabled=False):
        logits = F.linear(hidden.float(), weight, bias) / temperature
    log_normalizer = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - log_normalizer
    if not with_entropy:
        return logprobs, None
    with torch.no_grad():  # a metric: -sum_v p log p = logsumexp - sum_v p * logit
        entropy = log_normalizer - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return logprobs, entropy


# --------------------------------------------------------------------------------------------------
# Held-out evaluation: greedy pass@1 and mean reward
# --------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, tokenizer, task, examples, *, style, max_new_tokens,
             batch_size=256, samples=None):
    """Greedy decoding on held-out examples -> {"pass@1", "reward", "length",
    "pass@1_se", "reward_se"} (python floats; _se: standard errors over the examples).

    pass@1: share of examples whose greedy completion has reward >= task.pass_threshold.
    samples: a list that receives (completion, reward) of every example, to show a few
    (harness/run.py prints some at each eval).
    """
    rewards, lengths, completions = [], [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        rollouts = generate_rollouts(model, tokenizer,
                                     render_prompts(tokenizer, task, chunk, style), 1,
                                     max_new_tokens=max_new_tokens, greedy=True)
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
