"""benchmarks/floor.py: the FLOP and byte counts of each phase against a hand count on a tiny shape, the decode
floor's two limits, the report's arithmetic, and what a recorded step hands it."""
import contextlib
import functools
from collections import defaultdict

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import train
from benchmarks import floor
from benchmarks.floor import timed
from harness.config import Config
from tests.stubs import DigitsTask, tiny_policy_and_rollouts

# hidden 4, 1 layer, 2 heads of dim 2, 1 KV head, MLP 6, vocabulary 10, tied head
TINY = floor.Shape(hidden=4, layers=1, heads=2, kv_heads=1, intermediate=6, vocab=10, tied=True, head_dim=2)
PEAKS = floor.Peaks(flops=100.0, bandwidth=100.0, source="test")  # 100 FLOP/s, 100 B/s: both terms matter
# two prompts of 3 and 5 tokens, M = 2: rows 0, 1 on the first prompt generated 2 and 1 tokens, rows 2, 3: 1 and 3
WORK = floor.Workload(prompt_lengths=[3, 5], completion_lengths=[2, 1, 1, 3], dtype="fp32",
                      forwards=[floor.Forward([3, 5], [3, 3, 5, 5], [2, 1, 1, 3], trains=True)])


def test_parameter_counts_by_hand_and_against_the_model():
    # q and o: 4 x (2 heads x 2) = 16 each; k and v: 4 x (1 x 2) = 8 each; MLP: 3 x 4 x 6 = 72
    assert TINY.layer_matmul_params == 16 + 16 + 8 + 8 + 72 == 120
    assert TINY.head_params == 40
    # embedding 40 (the head shares it) + the layer's 120 + its two norms 8 + the final norm 4
    assert TINY.params == 40 + 120 + 8 + 4 == 172
    assert TINY.kv_bytes_per_token(4) == 2 * 1 * 1 * 2 * 4 == 16  # K and V, 1 layer, 1 KV head of dim 2, fp32
    model = LlamaForCausalLM(LlamaConfig(hidden_size=4, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=6, vocab_size=10,
                                         tie_word_embeddings=True))
    assert floor.shape_of(model.config) == TINY
    assert sum(p.numel() for p in model.parameters()) == TINY.params
    linear = sum(m.weight.numel() for m in model.model.modules() if isinstance(m, torch.nn.Linear))
    assert linear == TINY.body_matmul_params


def test_known_shapes_have_their_published_sizes():
    assert round(floor.shape_of("qwen2.5-0.5b").params / 1e6) == 494  # Qwen2.5-0.5B: 0.49B
    assert round(floor.shape_of("qwen2.5-1.5b").params / 1e6) == 1544  # 1.54B
    assert round(floor.shape_of("smollm2-135m").params / 1e6) == 135


def test_prefill_by_hand():
    # prompts but their last token: 2 and 4 tokens; causal (query, key) pairs 1+2 = 3 and 1+2+3+4 = 10;
    # attention: 4 x 1 layer x 2 heads x dim 2 = 16 FLOPs per pair
    flops = 2 * 120 * (2 + 4) + 16 * (3 + 10)
    bytes_moved = 120 * 4 + (2 + 4) * 16  # the body's weights once, the cache of 6 positions written
    f = floor.prefill_floor(TINY, WORK, PEAKS)
    assert (f.flops, f.bytes) == (flops, bytes_moved) == (1648, 576)
    assert f.seconds == pytest.approx(16.48) and f.bound == "FLOPs"


def test_decode_by_hand():
    # each running row: 2 x (120 + 40) FLOPs of matmuls + 16 per key it sees; bytes: 160 x 4 of weights + 16 a key
    # t=0: 4 rows, keys 3+3+5+5 = 16: 1280 + 256 = 1536 FLOPs, 640 + 256 = 896 B  -> 15.36 s (FLOPs)
    # t=1: rows 0 and 3, keys 4+6 = 10:  640 + 160 =  800 FLOPs, 640 + 160 = 800 B -> 8.00 s
    # t=2: row 3, keys 7:                320 + 112 =  432 FLOPs, 640 + 112 = 752 B -> 7.52 s (bytes)
    f = floor.decode_floor(TINY, WORK, PEAKS)
    assert (f.flops, f.bytes) == (1536 + 800 + 432, 896 + 800 + 752)
    assert f.seconds == pytest.approx(15.36 + 8.00 + 7.52)
    assert f.bound == "FLOPs"  # 2 of its 3 steps


def test_decode_limits():
    # infinite bandwidth: every step FLOP-bound, the floor is all FLOPs at the peak; infinite FLOPs: all bytes
    fast_memory = floor.decode_floor(TINY, WORK, floor.Peaks(100.0, float("inf"), "test"))
    assert fast_memory.seconds == pytest.approx(fast_memory.flops / 100.0)
    fast_math = floor.decode_floor(TINY, WORK, floor.Peaks(float("inf"), 100.0, "test"))
    assert fast_math.seconds == pytest.approx(fast_math.bytes / 100.0) and fast_math.bound == "bytes"
    # and with both finite the per-step max lies between the larger of the two totals and their sum
    both = floor.decode_floor(TINY, WORK, PEAKS)
    assert max(fast_memory.seconds, fast_math.seconds) <= both.seconds <= fast_memory.seconds + fast_math.seconds


def test_forward_backward_and_optimizer_by_hand():
    # prompts once: 2 x 120 x (2 + 4) + 16 x (3 + 10) = 1648; completions: 2 x 160 x 7 tokens = 2240 and keys
    # (token i of a row after a p-token prompt sees p + i): 3+4, 3, 5, 5+6+7 = 33 -> 528. Forward 4416, x 3
    f = floor.forwards_floor(TINY, WORK, PEAKS, trains=True)
    assert f.flops == 3 * (1648 + 2240 + 528) == 13248
    assert f.bytes == 3 * 160 * 4 and f.seconds == pytest.approx(132.48)
    assert floor.forwards_floor(TINY, WORK, PEAKS, trains=False).seconds == 0  # no pi_old forward ran
    opt = floor.optimizer_floor(TINY, WORK, PEAKS)
    assert opt.bytes == 28 * 172 and opt.seconds == pytest.approx(48.16) and opt.bound == "bytes"


def test_report_arithmetic():
    floors = floor.step_floors(TINY, WORK, PEAKS)
    measured = {"rollout": 100.0, "prefill": 20.0, "decode": 80.0, "reward+advantage": 1.0, "update": 362.0,
                "forward+backward": 265.0, "optimizer step": 97.0}
    rows = {name.strip(): (m, f) for name, m, f, _ in floor.report_rows(measured, floors)}
    assert "no-grad forwards" not in rows  # none ran
    assert rows["rollout"] == (100.0, pytest.approx(16.48 + 30.88))
    assert rows["update"] == (362.0, pytest.approx(132.48 + 48.16))
    assert rows["reward+advantage"] == (1.0, None)  # no floor: Python on the host
    assert rows["step"] == (100.0 + 1.0 + 362.0, pytest.approx(16.48 + 30.88 + 132.48 + 48.16))
    text = floor.format_report(measured, floors, PEAKS)
    assert f"{265.0 / 132.48:8.1f}" in text.splitlines()[6]  # forward+backward's ratio, 2.0
    assert "measured s" in text and "peaks: 0.000 TFLOP/s, 0.0 GB/s (test)" in text


def test_decode_costs_line_measures_the_reads_and_the_sampling(one_thread):
    """The decode's two costs beside its floor: the rate its layer matmuls read their weights at (how many layers'
    worth fit the budget), and sampling one token per row; each against the peaks it names."""
    shape = floor.Shape(hidden=64, layers=3, heads=4, kv_heads=2, intermediate=128, vocab=500)
    per_layer = (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128) * 4  # q, o (4 heads of 16); k, v; gate, up, down
    assert per_layer == 147456  # 144 KiB at fp32
    line = floor.decode_costs(shape, "cpu", "fp32", floor.Peaks(1e12, 1e9, "test"), rows=4, budget_mib=0.3)
    assert line.startswith("decode at 4 rows: the layer matmuls read their weights at ")
    assert "2 layers' worth" in line and "over 500 ids" in line  # 0.3 MiB holds two layers of 144 KiB
    rate = float(line.split("weights at ")[1].split(" GB/s")[0])
    percent = int(line.split("GB/s (")[1].split("%")[0])
    assert rate > 0 and abs(percent - 100 * rate) <= 1 + 0.06 * percent  # against the 1 GB/s given (rounded)


def test_forward_of_reads_lengths_and_shared_prompts():
    # [prompt | completion], width 3: rows 0, 1 share the left-padded prompt of 2 tokens, row 2 has 3 tokens
    attention = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    completion = attention[:, 3:].float()
    f = floor.forward_of(attention, completion, trains=False)
    assert sorted(f.prompt_lengths) == [2, 3] and f.row_prompt_lengths == [2, 2, 3]
    assert f.completion_lengths == [2, 3, 1] and not f.trains


def test_known_gpu_names():
    assert floor.known_gpu("NVIDIA H200") == "H200"
    assert floor.known_gpu("NVIDIA H100 80GB HBM3") == "H100"  # SXM; PCIe and NVL their own peaks (issue 73)
    assert floor.known_gpu("NVIDIA H100 PCIe") == "H100 PCIe" and floor.known_gpu("NVIDIA H100 NVL") == "H100 NVL"
    assert floor.known_gpu("NVIDIA A100-SXM4-80GB") == "A100"
    assert floor.known_gpu("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert floor.known_gpu("NVIDIA L4") == "L4" and floor.known_gpu("NVIDIA L40S") is None
    peaks = floor.peaks_for("cpu", "bf16", gpu="H200", gbps=1000)
    assert (peaks.flops, peaks.bandwidth) == (989e12, 1e12) and "overridden" in peaks.source


def test_recorded_step_hands_the_floor_what_ran(digits_task):
    """AR + Lopti on a tiny policy: one no-grad pi_old forward of the active rows, the training forwards, the
    optimizer steps update_batch reports; optimizer.step and train.token_logprobs are restored after."""
    tokenizer, model, _ = tiny_policy_and_rollouts()
    config = Config(style="compact", num_generations=4, max_new_tokens=6, micro_batch=4, method="softmax",
                    alpha=0.3, lopti_eta=0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seconds = defaultdict(float)
    torch.manual_seed(0)
    with floor.recorded(functools.partial(timed, seconds, torch.device("cpu")), optimizer) as record:
        rollouts, _, advantages = train.collect_rollouts(model, tokenizer, DigitsTask(), DigitsTask().examples(
            "train", 2, 0), config)
        stats = train.update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                                   rollouts.completion_mask, advantages, config)
    assert "step" not in vars(optimizer) and train.token_logprobs.__name__ == "token_logprobs"
    active = (rollouts.completion_mask.any(1) & (advantages != 0)).nonzero().squeeze(1)
    no_grad = [f for f in record["forwards"] if not f.trains]
    assert len(no_grad) == 1 and no_grad[0].completion_lengths == rollouts.completion_mask[active].sum(1).tolist()
    assert len(record["optimizer steps"]) == stats["optimizer_steps"] > 0
    assert {"no-grad forwards", "optimizer step"} <= seconds.keys() and "prefill" not in seconds
    work = floor.workload_of(rollouts, 4, record, "fp32")
    assert work.prompt_lengths == rollouts.attention_mask[::4, :-6].sum(1).tolist() and len(work.prompt_lengths) == 2


def test_prefill_is_timed_apart_one_forward_of_the_rows_prompts(digits_task):
    """generate prefills inside its call (and a hook there would sit inside HF's compiled forward):
    prefill_seconds times one no-grad forward of the rollout's rows' prompts [B, P], the last
    position's logits only, and the decode is the rollout less it (before issue 79 the clock timed
    the shared prefill, which is gone)."""
    tokenizer, model, _ = tiny_policy_and_rollouts()
    config = Config(style="compact", num_generations=4, max_new_tokens=6, micro_batch=4, method="softmax")
    torch.manual_seed(0)
    examples = DigitsTask().examples("train", 2, 0)
    rollouts, _, _ = train.collect_rollouts(model, tokenizer, DigitsTask(), examples, config)
    seen = []
    hook = model.register_forward_hook(lambda module, args, kwargs, output: seen.append((
        kwargs["input_ids"].shape, output.logits.shape[1], torch.is_grad_enabled())),
        with_kwargs=True)
    try:
        seconds = floor.prefill_seconds(model, rollouts, "fp32")
    finally:
        hook.remove()
    prompt_width = rollouts.input_ids.shape[1] - 6
    assert seconds > 0 and seen == [((8, prompt_width), 1, False)]
    measured = floor.measured_phases({"rollout": 1.0, "update_policy": 0.5, "prefill": 0.25})
    assert (measured["prefill"], measured["decode"]) == (0.25, 0.75)
    assert "decode" not in floor.measured_phases({"rollout": 1.0, "update_policy": 0.5})


def test_update_head_counts_at_the_tf32_rate_under_bf16():
    # rollout.chunk_logprobs runs the update's head in float32, its floor at TF32's rate: half the
    # bf16 rate, so its FLOPs count twice. Completions: 7 tokens x 2 x 40 head weights = 560 more FLOPs a forward, x 3 with its backward
    import dataclasses
    fp32 = floor.forwards_floor(TINY, WORK, PEAKS, trains=True)
    bf16 = floor.forwards_floor(TINY, dataclasses.replace(WORK, dtype="bf16"), PEAKS, trains=True)
    assert bf16.flops - fp32.flops == 3 * 7 * 2 * TINY.head_params == 1680
