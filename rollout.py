"""Rollouts with Hugging Face `generate`, and the log-probabilities of the sampled tokens (DESIGN.md
section 5).

Layout used everywhere in this repo: a batch row is [left-padded prompt | completion], the
completion being the last T columns. `completion_mask` [B, T] marks the generated tokens up to and
including the first EOS; the log-prob tensors [B, T] line up with it column for column.
"""
import contextlib
import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
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


GREEDY = dict(do_sample=False, temperature=None, top_p=None, top_k=None)  # plain argmax
# fast/generate.py's default options (generate_rollouts' fast=)
FAST_GENERATE = dict(share_prefill=True, drop_finished_every=None, compiled=False)


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
    num_generations: int           # M, so rewards.view(-1, M) is [G, M]


def plain_generate(model, input_ids, attention_mask, *, max_new_tokens, pad_id, eos_id,
                   generate_kwargs):
    """One HF generate call on rows already repeated M times -> completion ids [rows, T]."""
    sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                               max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                               eos_token_id=eos_id, **generate_kwargs)
    return sequences[:, input_ids.shape[1]:]


def sample_completions(model, prompt_ids, num_generations, *, pad_id, eos_id, max_new_tokens,
                       generate_kwargs, fast=None):
    """M completions of each prompt -> (prompt ids [N*M, P], prompt mask [N*M, P],
    completion ids [N*M, T]).

    fast: None, the plain generate call; or fast/generate.py's options (share_prefill,
    drop_finished_every, compiled): the same completions, token for token, in less time.
    """
    device = next(model.parameters()).device
    prompt_input_ids, prompt_mask = (t.to(device) for t in left_pad(prompt_ids, pad_id))
    if fast:  # fast/generate.py: the same completions sooner (None: its check refused them here)
        from fast.generate import sample_completions as fast_sample_completions
        sampled = fast_sample_completions(
            model, plain_generate, prompt_input_ids, prompt_mask, num_generations,
            max_new_tokens=max_new_tokens, pad_id=pad_id, eos_id=eos_id,
            generate_kwargs=generate_kwargs, **fast)
        if sampled is not None:
            return sampled
    input_ids = prompt_input_ids.repeat_interleave(num_generations, dim=0)
    attention_mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    return input_ids, attention_mask, plain_generate(
        model, input_ids, attention_mask, max_new_tokens=max_new_tokens, pad_id=pad_id,
        eos_id=eos_id, generate_kwargs=generate_kwargs)


@torch.no_grad()
def generate_rollouts(model, tokenizer, prompt_ids, num_generations, *, max_new_tokens,
                      temperature=1.0, top_p=1.0, greedy=False, mask_truncated=False,
                      rollout_batch=None, fast=None):
    """M = num_generations sampled completions of each prompt (token-id lists) -> Rollouts.

    Plain ancestral sampling at `temperature` up to top_p (top_k off, no repetition penalty, nothing
    from the model folder's generation_config.json), so p_old = softmax(logits / temperature): what
    the PPO ratio assumes. greedy: argmax. Seed with torch.manual_seed. mask_truncated: rows without
    EOS leave the loss (still rewarded). rollout_batch: at most this many rows (whole groups) per
    generate call. fast: None, the plain call; or fast/generate.py's options, FAST_GENERATE's keys:
    the same tokens sooner (DESIGN.md section 5).
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
                                    generate_kwargs=generate_kwargs, fast=fast)
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
# Log-probabilities of the sampled tokens: the definition here,
# the fast path (same numbers) in fast/logprobs.py
# --------------------------------------------------------------------------------------------------
def token_logprobs(model, input_ids, attention_mask, completion_mask, *, temperature=1.0,
                   micro_batch=None, with_entropy=False, fast=False, logit_chunk=1024,
                   fp32_head=True, body_autocast=True, share_prompts=True):
    """log pi(o_t | o_<t) of the completion tokens under logits / temperature -> [B, T] float32.

    input_ids, attention_mask [B, P+T]; completion_mask [B, T] (its width T: the completion is the
    last T columns). with_entropy: also the entropy of each token's distribution [B, T], detached.
    micro_batch: rows per forward. Positions as HF generate gives them with left padding, so each
    token is scored as it was sampled. body_autocast=False: the forward in the weights' dtype. fast:
    fast/logprobs.py, the same values up to rounding with less memory (shared prompts, a float32
    head on logit_chunk tokens at a time: logit_chunk, fp32_head and share_prompts are its only);
    the plain path below (the default) is the definition.
    """
    if fast:  # same numbers, less memory and compute: see fast/logprobs.py
        from fast.logprobs import token_logprobs as fast_token_logprobs
        return fast_token_logprobs(
            model, input_ids, attention_mask, completion_mask, temperature=temperature,
            micro_batch=micro_batch, with_entropy=with_entropy, logit_chunk=logit_chunk,
            fp32_head=fp32_head, body_autocast=body_autocast, share_prompts=share_prompts)
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
             batch_size=256, samples=None, fast=False):
    """Greedy decoding on held-out examples -> {"pass@1", "reward", "length",
    "pass@1_se", "reward_se"} (python floats; _se: standard errors over the examples).

    pass@1: share of examples whose greedy completion has reward >= task.pass_threshold.
    samples: a list that receives (completion, reward) of every example, to show a few
    (harness/run.py prints some at each eval). fast: generate_rollouts' FAST_GENERATE path (fast/).
    """
    rewards, lengths, completions = [], [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        rollouts = generate_rollouts(model, tokenizer,
                                     render_prompts(tokenizer, task, chunk, style), 1,
                                     max_new_tokens=max_new_tokens, greedy=True,
                                     fast=FAST_GENERATE if fast else None)
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
