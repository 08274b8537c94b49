"""Seconds per RL step of train.py's step on a randomly initialised model with a real model's shape (no download).

    python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda            # 64 prompts x M=8 x 256
    python benchmarks/random_model_step.py --shape test --device cpu --steps 1           # seconds, a smoke test

What a GPU user should expect from the papers' settings without downloading weights: the step's cost depends on the
shape (layers, width, vocabulary) and the token counts, not on what the weights know. Random weights rarely emit EOS,
so every completion runs to --max-new-tokens: the worst case for rollout time and memory. Rewards are a graded
function of the completion text (so groups differ and every row is trained on, as with a real reward). The step is
train.collect_rollouts + train.update_policy, exactly as train.py calls them; prints s/step (median), completion
tokens/s and peak GPU memory (peak RSS on a CPU), then each phase against its floor (benchmarks/floor.py: the GPU's
datasheet peaks when its name is in floor.KNOWN_GPUS, else a probe).
"""
import argparse
import functools
import os
import statistics
import sys
import time
from collections import defaultdict

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import train  # noqa: E402
from benchmarks import floor  # noqa: E402
from benchmarks.floor import sync, timed  # noqa: E402
from fast import generate as fast_generate, kv_cache  # noqa: E402
from harness.config import Config  # noqa: E402
from harness import policy  # noqa: E402

SHAPES = {  # Qwen2.5 configs (hidden, layers, heads, kv heads, MLP, vocab); "test" is for CPU smoke tests
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True),
    "test": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512, tie_word_embeddings=True),
}


def build(shape, seed=0, device="cpu"):
    """A random Qwen2 model of `shape` and a word-level tokenizer with exactly its vocabulary size. The weights are
    drawn on `device` (a 3B model drawn on a CPU takes minutes of a GPU check; on CUDA, a second)."""
    vocab = {"<pad>": 0, "<eos>": 1, " ": 2, **{f"w{i}": i + 3 for i in range(SHAPES[shape]["vocab_size"] - 3)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        padding_side="left")
    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, pad_token_id=0, eos_token_id=1,
                         bos_token_id=1)
    with torch.device(device):
        return Qwen2ForCausalLM(config), tokenizer


def fast_generate_ran(model):
    """Whether --fast-generate's compiled path ran on `model`: False when its self-check refused it there (the run
    then generated with the plain call), True where it passed or was never needed (a tested device)."""
    return getattr(model, "_fast_self_check", {}).get(True, not fast_generate.untested_device(model))


class GradedTask:
    """Prompts of 32 random words; reward = the share of completion words with an even index (graded, in [0, 1])."""
    name, pass_threshold = "graded", 0.5

    def examples(self, split, n, seed):
        g = torch.Generator().manual_seed(seed)
        return [{"words": torch.randint(3, 500, (32,), generator=g).tolist()} for _ in range(n)]

    def prompt(self, example, style="compact"):
        return " ".join(f"w{i}" for i in example["words"])

    def reward(self, completion, example, style="compact"):
        words = [w for w in completion.replace("w", " w").split() if w[1:].isdigit()]
        return sum(int(w[1:]) % 2 == 0 for w in words) / max(len(words), 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp32"), help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("-M", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="measured steps, after one warm-up step")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--rollout-batch", type=int, default=None)
    p.add_argument("--lopti", action="store_true", help="AR (alpha 0.3) + Lopti (eta 0.5) instead of one pass")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the floor's FLOP peak")
    p.add_argument("--peak-gbps", type=float, default=None, help="override the floor's bandwidth peak (GB/s)")
    p.add_argument("--fast-generate", action="store_true", help="static KV cache + the decode loop, a CUDA graph a step on CUDA (fast/generate.py)")
    p.add_argument("--concatenated-cache", action="store_true",
                   help="HF's DynamicCache as it is, concatenating every token (before fast/kv_cache.py's roomy_cache)")
    p.add_argument("--roomy-cache", action="store_true",
                   help="fast/kv_cache.py's roomy cache on this device too (a CPU's default, not CUDA's)")
    p.add_argument("--gpu", choices=sorted(floor.KNOWN_GPUS), default=None,
                   help="the floor's peaks from this datasheet (default: the CUDA device's name, else a probe)")
    args = p.parse_args(argv)
    if args.concatenated_cache:  # the measurement of what roomy_cache saves
        kv_cache.roomy_cache = kv_cache.concatenating_cache
    if args.roomy_cache:  # where it is not the default (fast/generate.py's ROOMY_CACHE_DEVICES)
        fast_generate.ROOMY_CACHE_DEVICES = ("cpu", torch.device(args.device).type)
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    model, tokenizer = build(args.shape, device=args.device)
    model.train()
    task = GradedTask()
    config = Config(style="compact", num_generations=args.M, max_new_tokens=args.max_new_tokens,
                    rollout_batch=args.rollout_batch, method="softmax", tau=0.1, dtype=dtype,
                    micro_batch=args.micro_batch, alpha=0.3 if args.lopti else 0.0,
                    lopti_eta=0.5 if args.lopti else 0.0, fast_generate=args.fast_generate)
    optimizer = policy.adamw_class(config)(model.parameters(), lr=1e-6, weight_decay=0.01)  # train.py's: fused on CUDA
    device = torch.device(args.device)
    peaks = floor.peaks_for(device, dtype, gpu=args.gpu, tflops=args.peak_tflops, gbps=args.peak_gbps)  # before the run: the probe's tensors are gone by then
    seconds, tokens, phases, floors = [], [], [], []
    for step in range(args.steps + 1):
        clocked = defaultdict(float)
        clock = functools.partial(timed, clocked, device)
        sync(device)
        start = time.perf_counter()
        with floor.recorded(clock, optimizer) as record:
            rollouts, rewards, advantages = train.collect_rollouts(model, tokenizer, task,
                                                                   task.examples("train", args.prompts, step),
                                                                   config, clock=clock)
            with clock("update_policy"):
                stats = train.update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                                           rollouts.completion_mask, advantages, config)
        sync(device)
        if step > 0:  # the first step warms up kernels and the allocator
            seconds.append(time.perf_counter() - start)
            tokens.append(rollouts.completion_mask.sum().item())
            phases.append(floor.measured_phases(clocked))
            floors.append(floor.step_floors(floor.shape_of(model.config),
                                            floor.workload_of(rollouts, args.M, record, dtype), peaks))
        compiling = " (warm-up: kernels, allocator" + (", fast generate's graph capture)" if args.fast_generate
                                                         and fast_generate_ran(model) else ")") if step == 0 else ""
        print(f"step {step}: {time.perf_counter() - start:.2f} s{compiling}, rollout {clocked['rollout']:.2f} s, "
              f"reward {rewards.mean():.3f}, optimizer steps {stats['optimizer_steps']}", flush=True)
        first_rollout = clocked["rollout"] if step == 0 else first_rollout
    peak = f"peak GPU memory {floor.memory_mib(device)[0] / 1024:.1f} GiB ({torch.cuda.get_device_name()})" \
        if device.type == "cuda" else f"peak RSS {floor.memory_mib(device)[0] / 1024:.2f} GiB"
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    label = " | fast generate" + ("" if fast_generate_ran(model) else " REFUSED by its self-check (plain generate ran)")
    print(f"RESULT {args.shape} ({n_params:.0f}M params, {dtype}, {args.device}) | {args.prompts} prompts x M={args.M}"
          f" x {args.max_new_tokens} tokens | {'AR+Lopti' if args.lopti else 'one pass'}"
          f"{label if args.fast_generate else ''}"
          f"{' | concatenated cache' if args.concatenated_cache else ''}{' | roomy cache' if args.roomy_cache else ''} | "
          f"{statistics.median(seconds):.2f} s/step | {statistics.median(tokens) / statistics.median(seconds):.0f} "
          f"completion tokens/s | {peak}")
    print(floor.format_report(floor.median_phases(phases), floor.median_floors(floors), peaks,
                              title=f"{args.shape} vs floor (median)"))
    if args.fast_generate and fast_generate_ran(model):  # paid once per run and shape
        print(f"fast generate's warm-up: {first_rollout - floor.median_phases(phases)['rollout']:.1f} s "
              "(the warm-up step's rollout minus the median)")


if __name__ == "__main__":
    main()
