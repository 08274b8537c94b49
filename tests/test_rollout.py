"""rollout.py: the completion mask, left padding, generate_rollouts, and token_logprobs against the definition."""
import pytest
import torch

import tasks
from model import build_char_tokenizer, build_tiny_model
from rollout import completion_mask_from_ids, evaluate, generate_rollouts, left_pad, render_prompts, token_logprobs

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
    ids = r.completion_ids
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


# --- token_logprobs ------------------------------------------------------------------------------------------------
def test_token_logprobs_equal_full_log_softmax(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer("12 5>7:")["input_ids"], tokenizer("3>9:")["input_ids"], tokenizer("8 1 1>9:")["input_ids"]]
    torch.manual_seed(1)
    r = generate_rollouts(model, tokenizer, prompts, 3, max_new_tokens=8)
    T, temperature = r.completion_mask.shape[1], 0.7
    position_ids = (r.attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():  # the definition: full-vocabulary log-softmax of logits / temperature, then gather
        logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask, position_ids=position_ids).logits
        logp_all = torch.log_softmax(logits[:, -T - 1:-1].float() / temperature, dim=-1)
        expected = logp_all.gather(-1, r.completion_ids[..., None]).squeeze(-1)
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
    with torch.no_grad():
        ours = token_logprobs(model, out.sequences, full_mask, completion_mask)
    theirs = generate_logp.gather(-1, completion_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(ours * completion_mask, theirs * completion_mask, atol=1e-5, rtol=1e-5)


# --- prompts and evaluation ----------------------------------------------------------------------------------------
def test_render_prompts_compact_chat_and_plain_fallback(tiny):
    _, tokenizer = tiny
    examples = [{"text": "1 2>3:"}]
    compact = render_prompts(tokenizer, EchoTask(), examples, "compact")
    assert compact == [[BOS] + tokenizer.convert_tokens_to_ids(list("1 2>3:"))]  # one token per character
    plain = render_prompts(tokenizer, EchoTask(), examples, "chat")  # no template: the plain text
    assert tokenizer.decode(plain[0], skip_special_tokens=True) == "1 2>3:\n"
    templated = build_char_tokenizer(tasks.COMPACT_ALPHABET)
    templated.chat_template = "{% for m in messages %}<bos>u:{{ m['content'] }}\n{% endfor %}a:"
    ids = render_prompts(templated, EchoTask(), examples, "chat")
    assert ids[0].count(BOS) == 1  # the template's BOS only: the tokenizer must not add a second one
    assert templated.decode(ids[0], skip_special_tokens=True) == "u:1 2>3:\na:"


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
