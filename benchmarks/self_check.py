"""The fast paths' first-CUDA-rollout self-check (fast/generate.py's self_check) on its own, and its
cost.

    python benchmarks/self_check.py --device cuda   # the verdict on this GPU (benchmarks/gpu_check.sh)
    python benchmarks/self_check.py                 # on this CPU: the verdict (the check forced here)
    python benchmarks/self_check.py --force         # on this CPU: the verdict and its cost against one step

The verdict: the roomy cache (and --fast-generate's decode loop, "compiled": one CUDA graph a step
on CUDA, eager with --compiled on a CPU) against plain generate
on the tiny default shape at init and a random Qwen2 of --shape (benchmarks/random_model_step.py),
under the run's precision (bf16 autocast where the card has bf16, else fp32: harness/settle.py).
The cost: the check's seconds (a rollout call with the check minus the same call after it) over one
step of `python train.py`'s tiny default (--prompts 64 x M 8 x 12 tokens: collect_rollouts +
update_policy), medians of --repeats, on the tiny shape, --threads threads.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import tasks  # noqa: E402
import train  # noqa: E402
from benchmarks.random_model_step import build  # noqa: E402
from fast import generate as fast_generate  # noqa: E402
from fast.precision import precision  # noqa: E402
from harness import tiny  # noqa: E402
from harness.config import Config  # noqa: E402
from rollout import FAST_GENERATE, generate_rollouts, render_prompts  # noqa: E402


def checked_rollout_seconds(model, tokenizer, prompts, dtype, **paths):
    """(verdict, seconds of a one-token rollout call that runs the check, seconds of the same call
    once the verdict is kept); paths: rollout.FAST_GENERATE's share_prefill, compiled."""
    model.__dict__.pop("_fast_self_check", None)
    device = next(model.parameters()).device
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        with precision(device, dtype):
            generate_rollouts(model, tokenizer, prompts, 2, max_new_tokens=1, greedy=True,
                              fast=dict(FAST_GENERATE, **paths))
        seconds.append(time.perf_counter() - start)
    return model._fast_self_check[paths.get("compiled", False)], seconds[0], seconds[1]


PATHS = {"default cache": dict(), "default cache, no shared prefill": dict(share_prefill=False),
         "compiled": dict(compiled=True), "compiled, no shared prefill": dict(compiled=True, share_prefill=False)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                   help="auto: bf16 autocast where the card has bf16 (as a run), else fp32")
    p.add_argument("--force", action="store_true", help="on a CPU: also the check's cost against one step")
    p.add_argument("--shape", default="qwen2.5-0.5b", help="random_model_step.SHAPES, or none")
    p.add_argument("--compiled", action="store_true",
                   help="--fast-generate's decode loop too on a CPU (eager there)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, default=64, help="the step's prompts (the tiny default: 64)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    fast_generate.untested_device = lambda model: True  # the verdict on any device (a run checks on CUDA only)
    cuda_bf16 = args.device.startswith("cuda") and torch.cuda.is_bf16_supported()
    dtype = ("bf16" if cuda_bf16 else "fp32") if args.dtype == "auto" else args.dtype
    task = tasks.get_task("countdown", **tiny.COUNTDOWN_OPTIONS)
    char_tokenizer = tiny.build_char_tokenizer()
    models = {"tiny": (tiny.build_tiny_model(char_tokenizer, seed=0), char_tokenizer)}
    if args.shape != "none":
        models[args.shape] = build(args.shape)
    failed = []
    for name, (model, tokenizer) in models.items():
        model.to(args.device)
        examples = task.examples("train", 64, seed=0)
        prompts = render_prompts(tokenizer, task, examples, "compact") if name == "tiny" else \
            [tokenizer(" ".join(f"w{i}" for i in range(3, 35)))["input_ids"]] * 2
        compiled = args.compiled or args.device.startswith("cuda")
        for path, options in PATHS.items():
            if options.get("compiled") and not compiled:
                continue
            verdict, first, again = checked_rollout_seconds(model, tokenizer, prompts, dtype, **options)
            failed += [] if verdict else [f"{name} {path}"]
            print(f"{name}, {dtype}, {path}: {'match' if verdict else 'REFUSED'} (check {first - again:.3f} s)",
                  flush=True)
    print(f"self-check: {'every path matches' if not failed else 'refused: ' + ', '.join(failed)}")
    if args.device != "cpu" or not args.force:
        return
    # the cost on this CPU: the check against one step of the tiny default
    model, tokenizer = models["tiny"]
    config = tiny.apply_cpu_defaults(Config(dtype="fp32", prompts_per_step=args.prompts))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    examples = task.examples("train", config.prompts_per_step, seed=0)
    checks, steps = [], []
    for repeat in range(args.repeats):
        _, first, again = checked_rollout_seconds(model, tokenizer, render_prompts(
            tokenizer, task, examples, "compact"), "fp32")
        checks.append(first - again)
        start = time.perf_counter()
        rollouts, _, advantages = train.collect_rollouts(model, tokenizer, task, examples, config)
        train.update_batch(model, optimizer, rollouts.input_ids, rollouts.attention_mask,
                           rollouts.completion_mask, advantages, config)
        steps.append(time.perf_counter() - start)
    check, step = statistics.median(checks), statistics.median(steps)
    print(f"self-check {check:.4f} s, tiny default step {step:.3f} s: {check / step:.1%} of a step "
          f"(medians of {args.repeats}, {args.threads} thread(s), load "
          f"{os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
