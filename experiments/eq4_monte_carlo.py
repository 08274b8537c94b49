"""Eq. (4) checked by simulation (issue 30, item 4): the SoftmaxGRPO referee's prompt-weight test.

    python -m experiments.eq4_monte_carlo                     # (M, tau) = (8, 0.1), (4, 1.0), (16, 0.05); ~1 CPU-min
    python -m experiments.eq4_monte_carlo --groups 2000 --points 9 --configs 8:0.1

The referee: "simulate M binary rollouts at known p for a policy whose score is tractable, average
the unclipped update over many groups, compare with omega_{M,tau}(p) grad p". The policy is one
Bernoulli logit, p = sigmoid(theta), so grad_theta log pi(y) = y - p and grad_theta p = p (1 - p).
Each group draws M answers y ~ Bernoulli(p), reward R = y, the lesson's advantages and loss
(ppo.policy_loss on-policy: the ratio is 1, the update unclipped); autograd gives each group's g =
(1/M) sum_i A_i (y_i - p) (one theta per group). Eq. (4): E[g] = omega_{M,tau}(p) p (1 - p), so the
mean of g / (p (1 - p)) estimates omega, with a 95% interval mean +- 1.96 SE.

Writes <output-dir>/eq4_monte_carlo.csv (M, tau, p, exact omega, Monte-Carlo mean, SE, z = (mean -
exact) / SE) and eq4_monte_carlo.png; prints per (M, tau) the largest |z| and how many intervals
hold the exact value (about 95% if Eq. (4) is right). Numbers: lab/referees.md.
"""
import argparse
import math
import os

import numpy as np
import torch

from experiments import pyplot, save_figure, write_csv
from ppo import policy_loss
from softmax_grpo import group_advantages, prompt_weight

CONFIGS = ((8, 0.1), (4, 1.0), (16, 0.05))


def group_updates(p, M, tau, groups, generator):
    """The unclipped SoftmaxGRPO update of `groups` independent groups of M Bernoulli(p) answers, each on its own
    copy of theta = logit(p) -> [groups] float64 tensor g = -d loss / d theta."""
    theta = torch.full((groups,), math.log(p / (1 - p)), dtype=torch.float64, requires_grad=True)
    answers = (torch.rand(groups, M, generator=generator, dtype=torch.float64) < p).double()  # [groups, M]
    advantages = group_advantages(answers, "softmax", tau=tau).double()  # [groups, M]
    log_p1 = torch.nn.functional.logsigmoid(theta)[:, None]  # log pi(1), [groups, 1]
    log_p0 = torch.nn.functional.logsigmoid(-theta)[:, None]  # log pi(0)
    logprobs = torch.where(answers == 1, log_p1, log_p0).reshape(-1, 1)  # [groups * M, 1]: one token each
    loss, _ = policy_loss(logprobs, logprobs.detach(), advantages.reshape(-1), torch.ones_like(logprobs),
                          loss_agg="token-mean")  # mean over groups * M tokens
    loss.backward()
    return -theta.grad * groups  # undo the mean over groups: each group's own (1/M) sum_i A_i (y_i - p)


def simulate(configs, ps, groups, seed):
    """-> CSV rows: per (M, tau, p) the exact omega and the Monte-Carlo mean and SE of g / (p (1 - p))."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for M, tau in configs:
        for p in ps:
            estimates = group_updates(p, M, tau, groups, generator) / (p * (1 - p))
            mean, se = estimates.mean().item(), estimates.std().item() / math.sqrt(groups)
            exact = prompt_weight(p, M, tau)
            rows.append({"M": M, "tau": tau, "p": round(p, 6), "exact_omega": exact, "mc_mean": mean, "mc_se": se,
                         "z": (mean - exact) / se if se > 0 else 0.0})
    return rows


def summarize(rows):
    """Print per (M, tau): the largest |z| and the share of 95% intervals that hold the exact omega."""
    print("| M | tau | points | max abs z | 95% intervals holding exact omega | omega at the smallest p: exact, MC |")
    print("|---|---|---|---|---|---|")
    for M, tau in dict.fromkeys((r["M"], r["tau"]) for r in rows):
        mine = [r for r in rows if (r["M"], r["tau"]) == (M, tau)]
        inside = sum(abs(r["z"]) <= 1.96 for r in mine)
        low = mine[0]
        print(f"| {M} | {tau} | {len(mine)} | {max(abs(r['z']) for r in mine):.2f} | {inside} of {len(mine)} | "
              f"{low['exact_omega']:.3f}, {low['mc_mean']:.3f} ± {1.96 * low['mc_se']:.3f} |")


def plot(path, rows, title):
    plt = pyplot("the PNG; the CSV has the numbers")
    if plt is None:
        return False
    configs = list(dict.fromkeys((r["M"], r["tau"]) for r in rows))
    fig, axes = plt.subplots(1, len(configs), figsize=(4.2 * len(configs), 3.6), squeeze=False)
    fine = np.linspace(0.001, 0.999, 400)
    for ax, (M, tau) in zip(axes[0], configs):
        mine = [r for r in rows if (r["M"], r["tau"]) == (M, tau)]
        ax.plot(fine, prompt_weight(fine, M, tau), color="C0", label="exact ω(p), softmax_grpo.prompt_weight")
        ax.errorbar([r["p"] for r in mine], [r["mc_mean"] for r in mine], yerr=[1.96 * r["mc_se"] for r in mine],
                    color="C1", marker="o", markersize=3, linestyle="none", capsize=2,
                    label="Monte-Carlo mean, 95% CI")
        ax.set_title(f"M = {M}, τ = {tau}", fontsize=9)
        ax.set_xlabel("pass probability p")
        ax.set_ylabel("E[update] / ∇p")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(plt, fig, path, title)


def parse_configs(text, parser):
    try:
        configs = [(int(M), float(tau)) for M, tau in (item.split(":") for item in text.split(",") if item.strip())]
    except ValueError:
        parser.error(f"--configs: expected M:tau pairs like 8:0.1,4:1.0, got {text!r}")
    if not configs or any(M < 2 or not tau > 0 for M, tau in configs):
        parser.error(f"--configs: need M >= 2 and tau > 0, got {text!r}")
    return configs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--configs", default=",".join(f"{M}:{tau}" for M, tau in CONFIGS), help="M:tau pairs")
    parser.add_argument("--groups", type=int, default=20000, help="simulated groups per (M, tau, p)")
    parser.add_argument("--points", type=int, default=39, help="values of p, evenly spaced in (0, 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/eq4_monte_carlo")
    args = parser.parse_args(argv)
    if args.groups < 2 or args.points < 1:
        parser.error("--groups must be >= 2 and --points >= 1")
    configs = parse_configs(args.configs, parser)
    ps = [(i + 1) / (args.points + 1) for i in range(args.points)]
    rows = simulate(configs, ps, args.groups, args.seed)
    os.makedirs(args.output_dir, exist_ok=True)
    write_csv(os.path.join(args.output_dir, "eq4_monte_carlo.csv"), rows)
    summarize(rows)
    drew = plot(os.path.join(args.output_dir, "eq4_monte_carlo.png"), rows,
                f"Eq. (4): {args.groups} simulated groups per point (Bernoulli-logit policy, seed {args.seed})")
    print(f"wrote {args.output_dir}/eq4_monte_carlo.csv" + (" and eq4_monte_carlo.png" if drew else ""))
    return rows


if __name__ == "__main__":
    main()
