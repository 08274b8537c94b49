"""Table 3 (SoftmaxGRPO paper): the gradient budget's share per pass-rate bin, GRPO vs SoftmaxGRPO.

Protocol (DESIGN.md §7, which also shows why comparing the two estimators on the same samples is
an identity of binary rewards, c(k), not a measurement), every step a flag:
  1. Checkpoint  --checkpoint: a save_pretrained folder or a Hugging Face id.
  2. Prompts     the first --num-prompts held-out examples, task.examples("test", n, --seed).
  3. Rollouts    M (-M) completions per prompt at --temperature, torch seeded with --seed. Both
     methods score the SAME rollouts.
  4. Pass rate   p = k / M, k = completions of the group with reward >= task.pass_threshold.
  5. Advantages  group_advantages(rewards, "grpo") and group_advantages(rewards, "softmax", tau).
  6. Budget of one prompt (its M completions, lengths len_i, N = completion tokens of the batch):
       default   sum_i |A_i| len_i                                    (cheap, no backward)
       --exact   || grad_theta (1/N) sum_i A_i sum_t log pi(o_it) ||_2, one backward per prompt
  7. Share of a bin = sum of its prompts' budgets / the total. Bins [0,.1) [.1,.5) [.5,.9) [.9,1].
A group whose rewards are all equal has budget 0; with binary rewards and M < 10 the bin [0, .1)
holds only p = 0 groups (share 0 by construction): use -M 16.

    python -m experiments.table3_allocation --checkpoint runs/default/latest   # tiny model, seconds

Writes <output-dir>/table3_allocation.csv (bin, prompts, method, budget, share).
"""
import argparse
import csv
import os

import torch

import tasks
from experiments import output_file
from harness.config import Config
from harness.flags import parse_task_option
from harness.model import load_policy
from harness.tiny import apply_cpu_defaults, prompt_style
from rollout import generate_rollouts, render_prompts, token_logprobs
from softmax_grpo import group_advantages

BINS = ((0.0, 0.1), (0.1, 0.5), (0.5, 0.9), (0.9, 1.0))  # the last bin is closed: [.9, 1]
BIN_NAMES = ("[0,.1)", "[.1,.5)", "[.5,.9)", "[.9,1]")


# Shared with experiments/lopti_token_stats.py: checkpoint, task, rollouts
def add_checkpoint_arguments(parser):
    """The checkpoint and task flags shared by the diagnostics scripts (read by load_for_experiment)."""
    parser.add_argument("--checkpoint", default="runs/default/latest", help="save_pretrained folder or HF id")
    parser.add_argument("--task", default="countdown")
    parser.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE", help="as in train.py")
    parser.add_argument("--data", default=None, help="data file for gsm8k / text_match")


def load_for_experiment(args, parser):
    """Check -M / --num-prompts / --tau, then -> (model, tokenizer, style, task, defaults); bad input is a one-line
    parser error. defaults: a config.Config whose lr, max_new_tokens and task options are what train.py would choose
    for this policy (the tiny character model's CPU defaults: tiny.apply_cpu_defaults)."""
    if args.M < 2 or args.num_prompts < 1 or not args.tau > 0:
        parser.error("need -M >= 2, --num-prompts >= 1 and --tau > 0")
    try:
        dtype = torch.bfloat16 if str(args.device).startswith("cuda") else torch.float32
        model, tokenizer = load_policy(args.checkpoint, dtype=dtype, device=args.device)
        style = prompt_style(tokenizer)  # as train.py: compact prompts for the tiny character vocabulary
        defaults = Config(task=args.task, data=args.data,
                          task_options=dict(parse_task_option(text) for text in args.task_option))
        if style == "compact":
            defaults = apply_cpu_defaults(defaults)
        task = tasks.get_task(defaults.task, data=defaults.data, **defaults.task_options)
        return model, tokenizer, style, task, defaults
    except ValueError as error:
        parser.error(str(error))


def sample_groups(model, tokenizer, task, examples, M, *, style, max_new_tokens, temperature=1.0, batch_prompts=64):
    """M rollouts per example, `batch_prompts` prompts a chunk -> (chunks, rewards [G, M] float32);
    chunks: list of (Rollouts, first prompt index), a group's rows adjacent."""
    chunks, rewards = [], []
    for start in range(0, len(examples), batch_prompts):
        part = examples[start:start + batch_prompts]
        rollouts = generate_rollouts(model, tokenizer, render_prompts(tokenizer, task, part, style), M,
                                     max_new_tokens=max_new_tokens, temperature=temperature)
        rewards += [task.reward(text, part[i], style=style)
                    for text, i in zip(rollouts.completions, rollouts.prompt_index.tolist())]
        chunks.append((rollouts, start))
    return chunks, torch.tensor(rewards, dtype=torch.float32).view(len(examples), M)


# The two budgets and the binning
def token_budget(advantages, lengths):
    """Cheap budget per prompt: sum_i |A_i| len_i. advantages, lengths [G, M] -> [G]."""
    return (advantages.abs() * lengths).sum(dim=1)


def exact_budget(model, chunks, advantages, M, *, total_tokens, temperature=1.0):
    """Per prompt: || grad (1/N) sum_i A_i sum_t log pi(o_it) ||_2, N = total_tokens; advantages
    [G, M] -> [G] float32 (a group with all A_i = 0: 0, no backward)."""
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    budget = torch.zeros(advantages.shape[0])
    for rollouts, start in chunks:
        for local in range(rollouts.input_ids.shape[0] // M):
            g = start + local
            if not advantages[g].any():
                continue
            rows = slice(local * M, (local + 1) * M)
            mask = rollouts.completion_mask[rows]
            logprobs = token_logprobs(model, rollouts.input_ids[rows].to(device),
                                      rollouts.attention_mask[rows].to(device), mask, temperature=temperature)
            objective = (advantages[g].to(device)[:, None] * logprobs * mask.to(device)).sum() / total_tokens
            grads = torch.autograd.grad(objective, params, allow_unused=True)
            budget[g] = torch.sqrt(sum((gr.float() ** 2).sum() for gr in grads if gr is not None)).item()
    return budget


def bin_index(p):
    """Pass rates [G] -> bin index [G] in 0..3 for [0,.1) [.1,.5) [.5,.9) [.9,1]."""
    edges = torch.tensor([b[1] for b in BINS[:-1]])
    return torch.bucketize(p, edges, right=True)


def bin_shares(budget, bins):
    """budget [G] >= 0, bins [G] -> shares [4] summing to 1. ValueError when every budget is 0."""
    total = budget.sum()
    if not total > 0:
        raise ValueError("every prompt has budget 0 (all groups have equal rewards): no gradient to allocate; "
                         "use more prompts, a larger -M or a checkpoint whose pass rate is between 0 and 1")
    return torch.stack([budget[bins == b].sum() for b in range(len(BINS))]) / total


def allocation_table(rewards, pass_threshold, lengths, *, tau, exact_budgets=None):
    """rewards, lengths [G, M] -> CSV rows (bin, prompts, method, budget, share); exact_budgets:
    None or {"grpo": [G], "softmax": [G]} from exact_budget (same rollouts)."""
    M = rewards.shape[1]
    p = (rewards >= pass_threshold).float().sum(dim=1) / M
    bins = bin_index(p)
    counts = [int((bins == b).sum()) for b in range(len(BINS))]
    rows = []
    for method in ("grpo", "softmax"):
        budgets = {"tokens": token_budget(group_advantages(rewards, method, tau=tau), lengths)}
        if exact_budgets is not None:
            budgets["exact"] = exact_budgets[method]
        for budget_name, budget in budgets.items():
            for b, share in enumerate(bin_shares(budget, bins).tolist()):
                rows.append({"bin": BIN_NAMES[b], "prompts": counts[b], "method": method, "budget": budget_name,
                             "share": share})
    return rows


def binary_advantage_ratio(k, M, tau):
    """c(k): SoftmaxGRPO's advantages over GRPO's for a binary-reward group of k successes of M
    (0 < k < M), via group_advantages (DESIGN.md §7); ValueError if not proportional."""
    rewards = (torch.arange(M) < k).double()[None]  # [1, M]: k successes
    softmax, grpo = group_advantages(rewards, "softmax", tau=tau)[0], group_advantages(rewards, "grpo")[0]
    ratio = softmax / grpo
    if not torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-6):
        raise ValueError(f"SoftmaxGRPO's advantages are not a multiple of GRPO's at k = {k}, M = {M}")
    return ratio[0].item()


def identity_table(M, tau):
    """The per-k budget ratio c(k) for k = 1 .. M - 1: what the same-samples comparison is, for any policy."""
    return [{"k": k, "ratio": binary_advantage_ratio(k, M, tau)} for k in range(1, M)]


def print_table(rows, tau):
    columns = sorted({(r["method"], r["budget"]) for r in rows}, key=lambda c: (c[1] != "tokens", c[0] != "grpo"))
    label = {"grpo": "GRPO", "softmax": f"SoftmaxGRPO tau={tau:g}"}
    print("| pass-rate bin | prompts | " + " | ".join(f"{label[m]} ({b})" for m, b in columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    for name in BIN_NAMES:
        cells = {(r["method"], r["budget"]): r for r in rows if r["bin"] == name}
        first = next(iter(cells.values()))
        print(f"| {name} | {first['prompts']} | " + " | ".join(f"{cells[c]['share']:.3f}" for c in columns) + " |")


def main(argv=None):
    parser = argparse.ArgumentParser(description="Table 3: gradient budget by pass-rate bin, GRPO vs SoftmaxGRPO.")
    add_checkpoint_arguments(parser)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("-M", "--num-generations", dest="M", type=int, default=8)
    parser.add_argument("--tau", type=float, default=0.1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: train.py's (tiny or not)")
    parser.add_argument("--batch-prompts", type=int, default=64, help="prompts per generate call (memory knob)")
    parser.add_argument("--exact", action="store_true", help="also the parameter-gradient budget (1 backward/prompt)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output-dir", default="runs/table3")
    args = parser.parse_args(argv)
    model, tokenizer, style, task, defaults = load_for_experiment(args, parser)
    max_new_tokens = args.max_new_tokens or defaults.max_new_tokens

    torch.manual_seed(args.seed)
    examples = task.examples("test", args.num_prompts, seed=args.seed)
    chunks, rewards = sample_groups(model, tokenizer, task, examples, args.M, style=style,
                                    max_new_tokens=max_new_tokens, temperature=args.temperature,
                                    batch_prompts=args.batch_prompts)
    lengths = torch.cat([r.completion_mask.sum(dim=1) for r, _ in chunks]).view(-1, args.M).float()
    exact = None
    if args.exact:
        total_tokens = lengths.sum().item()
        exact = {method: exact_budget(model, chunks, group_advantages(rewards, method, tau=args.tau), args.M,
                                      total_tokens=total_tokens, temperature=args.temperature)
                 for method in ("grpo", "softmax")}
    try:
        rows = allocation_table(rewards, task.pass_threshold, lengths, tau=args.tau, exact_budgets=exact)
    except ValueError as error:
        parser.error(str(error))

    passed = (rewards >= task.pass_threshold).float()
    print(f"checkpoint {args.checkpoint} ({style} style), task {task.name}, {args.num_prompts} held-out prompts x "
          f"M={args.M}, temperature {args.temperature:g}: pass rate {passed.mean():.3f}, "
          f"groups with equal rewards {(rewards.max(1).values == rewards.min(1).values).float().mean():.3f}")
    print_table(rows, args.tau)
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, "table3_allocation.csv")
    with output_file(path) as f:
        writer = csv.DictWriter(f, fieldnames=["bin", "prompts", "method", "budget", "share"])
        writer.writeheader()
        writer.writerows({**r, "share": f"{r['share']:.6f}"} for r in rows)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
