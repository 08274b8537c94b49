"""Seconds per RL step of train.py's step on a randomly initialised model with a real model's shape (no download).

    python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda            # 64 prompts x M=8 x 256
    python benchmarks/random_model_step.py --shape test --device cpu --steps 1           # seconds, a smoke test
    python benchmarks/random_model_step.py --prompts 16 --micro-batch 64 --generate loop \
        --warmup 2 --per-token                                 # gpu_check.sh's part 1, one path

The step's cost depends on the shape and the token counts, not on what the weights know; random
weights rarely emit EOS, so every completion runs to --max-new-tokens (the worst case). The step is
train.py's; prints s/step, tokens/s, the peak memory, each phase against its floor (floor.py), and
last GENERATE {json}: what decides between the --generate paths, and the path that really ran.
"""
import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import rollout  # noqa: E402
import train  # noqa: E402
from benchmarks import floor  # noqa: E402
from benchmarks.floor import sync, timed  # noqa: E402
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


GENERATE = ("plain", "loop", "hf-static")  # --generate's paths: gpu_check.sh times each


@contextlib.contextmanager
def generate_path(path, model):
    if path != "hf-static":
        yield
        return
    from transformers import CompileConfig
    cuda = model.device.type == "cuda"
    compile_config = CompileConfig(fullgraph=True, dynamic=False,
                                   backend="inductor" if cuda else "eager",
                                   mode="reduce-overhead" if cuda else "default")
    compile_config._compile_all_devices = True  # else transformers compiles on GPUs only
    generate = model.generate
    model.generate = lambda *args, **kwargs: generate(
        *args, **kwargs, cache_implementation="static", compile_config=compile_config)
    try:
        yield
    finally:
        del model.generate  # the class's method again


def path_ran(model, path):
    if path == "loop":
        return "plain" if model.__dict__.get("_fast_generate", {}).get("off") else path
    return path if path != "hf-static" or hasattr(model, "_compiled_call") else "plain"


def launches_per_token(model, tokenizer, prompts, config, short=8, long=24):
    """Kernels (a CPU: aten ops) a decode token: a rollout of `long` tokens less one of `short`."""
    from torch.profiler import DeviceType, ProfilerActivity, profile
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    counts = []
    for tokens in (short, long):
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            with rollout.precision(device, config.dtype):
                rollout.generate_rollouts(model, tokenizer, prompts, config.num_generations,
                                          max_new_tokens=tokens, fast_generate=config.fast_generate)
            sync(device)
        counts.append(sum(e.device_type == DeviceType.CUDA if cuda else e.name.startswith("aten::")
                          for e in prof.events()))
    return (counts[1] - counts[0]) / (long - short)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp32"), help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("-M", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="measured steps, after the warm-up steps")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--rollout-batch", type=int, default=None)
    p.add_argument("--lopti", action="store_true", help="AR (alpha 0.3) + Lopti (eta 0.5) instead of one pass")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the floor's FLOP peak")
    p.add_argument("--peak-gbps", type=float, default=None, help="override the floor's bandwidth peak (GB/s)")
    p.add_argument("--generate", choices=GENERATE, default="plain", help="loop: --fast-generate; "
                   "hf-static: HF's static cache, compiled (a benchmark only)")
    p.add_argument("--per-token", action="store_true", help="also the kernels a decode token")
    p.add_argument("--gpu", choices=sorted(floor.KNOWN_GPUS), default=None, help="its datasheet")
    args = p.parse_args(argv)
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    model, tokenizer = build(args.shape, device=args.device)
    model.train()
    task = GradedTask()
    config = Config(style="compact", num_generations=args.M, max_new_tokens=args.max_new_tokens,
                    rollout_batch=args.rollout_batch, method="softmax", tau=0.1, dtype=dtype,
                    micro_batch=args.micro_batch, alpha=0.3 if args.lopti else 0.0,
                    lopti_eta=0.5 if args.lopti else 0.0, fast_generate=args.generate == "loop")
    optimizer = policy.adamw_class(config)(model.parameters(), lr=1e-6, weight_decay=0.01)  # train.py's: fused on CUDA
    device = torch.device(args.device)
    peaks = floor.peaks_for(device, dtype, gpu=args.gpu, tflops=args.peak_tflops, gbps=args.peak_gbps)  # before the run: the probe's tensors are gone by then
    seconds, tokens, phases, floors, first = [], [], [], [], {}
    with generate_path(args.generate, model):
        for step in range(args.warmup + args.steps):
            clocked = defaultdict(float)
            clock = functools.partial(timed, clocked, device)
            sync(device)
            start = time.perf_counter()
            with floor.recorded(clock, optimizer) as record:
                rollouts, rewards, advantages = train.collect_rollouts(
                    model, tokenizer, task, task.examples("train", args.prompts, step), config,
                    clock=clock)
                with clock("update_policy"):
                    stats = train.update_batch(model, optimizer, rollouts.input_ids,
                                               rollouts.attention_mask, rollouts.completion_mask,
                                               advantages, config)
            sync(device)
            took = time.perf_counter() - start
            clocked["prefill"] = floor.prefill_seconds(model, rollouts, dtype)  # apart, after it
            if step >= args.warmup:  # the warm-up steps: kernels, allocator, a capture, a compile
                seconds.append(took)
                tokens.append(rollouts.completion_mask.sum().item())
                phases.append(floor.measured_phases(clocked))
                floors.append(floor.step_floors(floor.shape_of(model.config), floor.workload_of(
                    rollouts, args.M, record, dtype), peaks))
            first = first or dict(step=took, rollout=clocked["rollout"])
            print(f"step {step}: {took:.2f} s{' (warm-up)' if step < args.warmup else ''}, rollout "
                  f"{clocked['rollout']:.2f} s, reward {rewards.mean():.3f}, optimizer steps "
                  f"{stats['optimizer_steps']}", flush=True)
        prompts = rollout.render_prompts(tokenizer, task, task.examples("train", args.prompts, 0),
                                         "compact")
        per_token = launches_per_token(model, tokenizer, prompts, config) if args.per_token \
            else None
    peak = floor.memory_mib(device)[0] / 1024
    peak_text = f"peak GPU memory {peak:.1f} GiB ({torch.cuda.get_device_name()})" \
        if device.type == "cuda" else f"peak RSS {peak:.2f} GiB"
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    ran = path_ran(model, args.generate)
    method = "AR+Lopti" if args.lopti else "one pass"
    label = f"generate {args.generate}" + \
        ("" if ran == args.generate else " REFUSED (plain generate ran)")
    print(f"RESULT {args.shape} ({n_params:.0f}M params, {dtype}, {args.device}) | {args.prompts} "
          f"prompts x M={args.M} x {args.max_new_tokens} tokens | micro-batch {args.micro_batch} | "
          f"{method} | {label} | {statistics.median(seconds):.2f} s/step | "
          f"{statistics.median(tokens) / statistics.median(seconds):.0f} completion tokens/s | "
          f"{peak_text}")
    measured, floored = floor.median_phases(phases), floor.median_floors(floors)
    print(floor.format_report(measured, floored, peaks, title=f"{args.shape} vs floor (median)"))
    over = first["rollout"] - measured["rollout"]
    print(f"first step {first['step']:.1f} s, its rollout {over:.1f} s over the median's (the "
          "warm-up: kernels, allocator, a capture or a compile)")
    rows = {name.strip(): (measured_s, floor_s)
            for name, measured_s, floor_s, _ in floor.report_rows(measured, floored)}
    numbers = dict(path=args.generate, ran=ran, rows=args.prompts * args.M,
                   device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   tokens=args.max_new_tokens, micro_batch=args.micro_batch,
                   ms_per_token=1e3 * rows["decode"][0] / args.max_new_tokens,
                   launches_per_token=per_token,
                   launches="kernels" if device.type == "cuda" else "aten ops",
                   decode_s=rows["decode"][0], decode_floor_s=rows["decode"][1],
                   step_s=rows["step"][0], step_floor_s=rows["step"][1],
                   first_step_s=first["step"], peak_gib=peak)
    print("GENERATE " + json.dumps(numbers))
    return numbers


if __name__ == "__main__":
    main()
