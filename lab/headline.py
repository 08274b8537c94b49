"""The headline comparison from its shipped rows: SoftmaxGRPO (tau 0.1) vs GRPO on 3-number Countdown at the fixed
recipe (lab.compare's countdown3 preset, no cell picked from a sweep), paired by seed.

    python -m lab.headline                                # the rows shipped from this CPU
    python -m lab.headline --machine "AMD EPYC, avx512"   # another CPU's (each CPU trains its own trajectories)

From lab/results/countdown3_runs.csv (cells countdown3-<grpo|softmax>-seed<N>) it prints, per metric (greedy pass@1;
sampled pass@1..8 of 8 samples), each method's mean +- SE over seeds, the paired difference with its 95% t-interval
("resolved" where it excludes 0), its paired t-test's p and whether Holm's correction over the five metrics keeps it,
and the power calculation (seeds for a 95% half-width <= --target at the measured SD); then Table 3's measured part
(DESIGN.md section 7: each trained policy's prompts per pass-rate bin and each method's own budget share), and draws
docs/countdown3_powered.png (matplotlib optional)."""
import argparse
import collections
import math
import os
import statistics
import sys

from experiments import pyplot, write_figure

from lab import reproduce
from lab.seed_stats import holm, mean_se_interval, paired_p, seeds_for_half_width
from experiments.table3_allocation import BIN_NAMES

METRICS = ("after_pass@1", "sampled_pass@1", "sampled_pass@2", "sampled_pass@4", "sampled_pass@8")
METHODS = ("grpo", "softmax")
FIGURE = os.path.join(reproduce.REPO, "docs", "countdown3_powered.png")
CELLS = [name for name in reproduce.CELLS if name.split("-")[:2] in (["countdown3", "grpo"], ["countdown3", "softmax"])]


def shipped_seeds(machine=None):
    """{method: {seed: {metric: value}}} of the countdown3 cells shipped from `machine`'s CPU (a substring of the
    row's machine; default this machine's CPU kind), only seeds shipped for both methods."""
    values = collections.defaultdict(dict)
    for name in CELLS:
        if shipped := reproduce.shipped_values(name, machine):
            values[name.split("-")[1]][int(name.rpartition("seed")[2])] = shipped
    both = sorted(set(values["grpo"]) & set(values["softmax"]))
    return {method: {seed: values[method][seed] for seed in both} for method in METHODS}


def paired(by_seed, key_grpo, key_softmax=None):
    """(grpo values, softmax values, softmax - grpo) over the seeds that have both keys."""
    key_softmax = key_softmax or key_grpo
    seeds = [s for s in by_seed["grpo"] if key_grpo in by_seed["grpo"][s] and key_softmax in by_seed["softmax"][s]]
    a = [by_seed["grpo"][s][key_grpo] for s in seeds]
    b = [by_seed["softmax"][s][key_softmax] for s in seeds]
    return a, b, [y - x for x, y in zip(a, b)]


def text(values, digits=3):
    mean, se, _ = mean_se_interval(values)
    return f"{mean:.{digits}f}" if se is None else f"{mean:.{digits}f} ± {se:.{digits}f}"


def difference(values, target=None, digits=3):
    """'mean [low, high] verdict' (95% t-interval over seeds) and, with target, the SD and the power calculation."""
    mean, se, interval = mean_se_interval(values)
    if interval is None:
        return f"{mean:+.{digits}f} (one seed: no interval)"
    verdict = "resolved" if interval[0] > 0 or interval[1] < 0 else "none resolved"
    out = f"{mean:+.{digits}f} [{interval[0]:+.{digits}f}, {interval[1]:+.{digits}f}] {verdict}"
    if target:
        sd = statistics.stdev(values)
        need = seeds_for_half_width(sd, target)
        out += (f" | SD {sd:.3f}, half-width {(interval[1] - interval[0]) / 2:.3f} | seeds for ±{target}: "
                + (str(need) if need else "> 1000"))
    return out


def report(by_seed, target):
    seeds = list(by_seed["grpo"])
    print(f"countdown3, SoftmaxGRPO (tau 0.1) - GRPO, paired by seed, n = {len(seeds)} seeds ({seeds}); "
          "mean ± SE over seeds; difference: mean [95% t-interval over seeds]")
    print("| held-out (200 prompts) | GRPO | SoftmaxGRPO | SoftmaxGRPO − GRPO, 95% CI | p, Holm over the metrics | "
          f"SD of the differences, half-width, seeds for ±{target} |")
    print("|---|---|---|---|---|---|")
    rows = [(key, *paired(by_seed, key)) for key in METRICS]
    rows = [row for row in rows if row[3]]
    p_values = [paired_p(diff) if len(diff) > 1 and len(set(diff)) > 1 else 1.0 for *_, diff in rows]
    for (key, a, b, diff), p, kept in zip(rows, p_values, holm(p_values)):
        label = "greedy pass@1" if key == "after_pass@1" else key.replace("sampled_", "") + " (8 samples)"
        first, _, power = difference(diff, target).partition(" | ")
        print(f"| {label} | {text(a)} | {text(b)} | {first} | {p:.3f}, {'survives' if kept else 'does not survive'}"
              f" | {power.replace(' | ', ', ')} |")
    level = 1 - 0.05 / len(rows)  # Bonferroni: each p below 0.05 / n, its interval at this level
    print(f"Bonferroni over the {len(rows)} metrics (p < {0.05 / len(rows):.2g}): {level:.0%} "
          "t-interval, p: " + "; ".join(
              f"{key.replace('sampled_', '')} {mean:+.3f} [{low:+.3f}, {high:+.3f}] p {p:.2g}"
              for (key, *_, diff), p in zip(rows, p_values)
              for mean, _, (low, high) in [mean_se_interval(diff, level)]))
    table3_measured(by_seed, "each trained policy")


def table3_measured(by_seed, policies):
    """Print Table 3's measured part (DESIGN.md section 7) from by_seed's table3_* metrics: per pass-rate bin, the
    prompts of each trained policy in it and each method's budget share on its own policy under its own advantages,
    mean +- SE over seeds, the differences paired by seed with their 95% t-intervals. `policies` names the
    checkpoints (e.g. "each trained policy", "the checkpoints of step 50")."""
    if not paired(by_seed, f"table3_prompts_{BIN_NAMES[0]}")[2]:
        print(f"\nTable 3 ({policies}): not shipped for these seeds")
        return
    print(f"\nTable 3, measured part: {policies} on 256 held-out prompts x 16 samples (p = k/16); "
          f"n = {len(paired(by_seed, f'table3_prompts_{BIN_NAMES[0]}')[2])} seeds, mean ± SE over seeds, "
          "difference (SoftmaxGRPO-trained − GRPO-trained) paired by seed")
    print("| pass-rate bin | prompts, GRPO-trained | prompts, SoftmaxGRPO-trained | difference, 95% CI | "
          "own share, GRPO-trained (GRPO adv.) | own share, SoftmaxGRPO-trained (its adv.) | difference, 95% CI |")
    print("|---|---|---|---|---|---|---|")
    for name in BIN_NAMES:
        a, b, diff = paired(by_seed, f"table3_prompts_{name}")
        sa, sb, sdiff = paired(by_seed, f"table3_share_grpo_adv_{name}", f"table3_share_softmax_adv_{name}")
        if not diff:
            continue
        print(f"| {name} | {text(a, 1)} | {text(b, 1)} | {difference(diff, digits=1)} | {text(sa)} | {text(sb)} | "
              f"{difference(sdiff)} |")


def plot(by_seed, path):
    """Left: each seed's paired difference (dots) with the mean and its 95% interval, per metric. Right: the two
    trained policies' prompts per pass-rate bin (mean ± SE over seeds). -> written?"""
    plt = pyplot("the figure; the printed tables have the numbers")
    if plt is None:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, key in enumerate(METRICS):
        _, _, diff = paired(by_seed, key)
        if not diff:
            continue
        left.scatter([i] * len(diff), diff, s=12, color="C0", alpha=0.5)
        mean, _, interval = mean_se_interval(diff)
        if interval:
            left.errorbar([i + 0.15], [mean], yerr=[[mean - interval[0]], [interval[1] - mean]], fmt="s",
                          color="C3", capsize=4)
    left.axhline(0, color="gray", lw=0.8)
    left.set_xticks(range(len(METRICS)), ["greedy\npass@1"] + [k.replace("sampled_", "") for k in METRICS[1:]])
    left.set_ylabel("SoftmaxGRPO − GRPO (same seed)")
    left.set_title(f"paired differences, n = {len(by_seed['grpo'])} seeds (95% CI)")
    width = 0.38
    for j, method in enumerate(METHODS):
        means, errors = [], []
        for name in BIN_NAMES:
            values = [by_seed[method][s][f"table3_prompts_{name}"] for s in by_seed[method]
                      if f"table3_prompts_{name}" in by_seed[method][s]]
            mean, se, _ = mean_se_interval(values) if values else (math.nan, None, None)
            means.append(mean), errors.append(se or 0)
        right.bar([x + (j - 0.5) * width for x in range(len(BIN_NAMES))], means, width, yerr=errors, capsize=3,
                  label=f"trained with {'GRPO' if method == 'grpo' else 'SoftmaxGRPO τ 0.1'}")
    right.set_xticks(range(len(BIN_NAMES)), BIN_NAMES)
    right.set_xlabel("held-out pass rate p = k/16")
    right.set_ylabel("prompts of 256 (mean ± SE over seeds)")
    right.set_title("where the trained policies' prompts sit")
    right.legend()
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lab.headline", description=__doc__.split("\n")[0])
    parser.add_argument("--machine", help="the rows of the CPU whose machine field contains this (default: this "
                                          "machine's CPU)")
    parser.add_argument("--target", type=float, default=0.03, help="the 95%% half-width the power calculation "
                                                                     "aims at (default 0.03)")
    parser.add_argument("--figure", default=FIGURE, help="where to draw the figure (default docs/...)")
    args = parser.parse_args(argv)
    if not args.target > 0:
        parser.error(f"--target must be > 0, got {args.target}")
    by_seed = shipped_seeds(args.machine)
    if not by_seed["grpo"]:
        raise reproduce.none_shipped("lab.headline", "countdown3 seed of both methods", CELLS, args.machine)
    report(by_seed, args.target)
    if plot(by_seed, args.figure):
        print(f"wrote {args.figure}")
    return by_seed


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
