"""The SoftmaxGRPO referee's clipping-and-KL question (issue 30, item 2): how active are the clip and the KL over
training, and what does the exact Eq. (2) objective give against the clipped recipe, on the same seeds?

    OMP_NUM_THREADS=1 python -m lab.referee_clipping            # seeds 0,1,2 -> runs/referees (18 runs)
    python -m lab.referee_clipping --summary-only               # the runs finished so far
    python -m lab.referee_clipping --shipped                    # lab/referees.md's numbers and figure, from
                                                                        # lab/results/referee_clipping_runs.csv

The runs are lab.compare's preset countdown3-eq2 for GRPO and SoftmaxGRPO (tau 0.1): eq2 (Eq. (2) exactly: one
epoch, one mini-batch, no KL, the clip out of reach; on-policy, so every ratio is exactly 1), recipe (clip 0.2 /
0.28, k3 KL 1e-3, one mini-batch: on a fp32 CPU it differs from eq2 by the KL term only) and recipe-2mb (2
mini-batches: the second step is off-policy, so the clip can act); lab/referees.md, section 2, says more.
Printed: per config the clipped-token fractions, the ratio's spread and the KL over training (metrics.jsonl); the
paired differences recipe - eq2 and recipe-2mb - eq2 of held-out pass@k with 95% t-intervals; whether each eq2 run
equals, row for row, the same seed's countdown3-tuning run at M 8. Writes <output-dir>/countdown3-eq2_activity.csv
(and .png with matplotlib).
"""
import csv
import os
import statistics

from experiments import pyplot, save_figure, write_csv

from lab import compare
from lab.ledger import ACTIVITY, activity, ratio_is_one
from lab.referee_tuning import METRICS, sweep_parser
from lab.seed_stats import paired_text
from harness.metrics import read_metrics

PRESET = "countdown3-eq2"
FIGURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures", "referee_clipping_activity.png")
SWEEP_CELL = {"grpo": "grpo-M8", "softmax": "softmax-M8-tau0.1"}  # the same train.py run but the clip bounds
COMPARED = ("reward_mean", "pass_rate", "zero_var_share", "pg_loss", "grad_norm", "entropy")


def read_runs(path):
    """<output-dir>/countdown3-eq2_runs.csv -> [{config, seed, output_dir, metric: float}]."""
    with open(path) as f:
        return [{"config": r["config"], "seed": int(r["seed"]), "output_dir": r["output_dir"],
                 **{key: float(r[key]) for key in METRICS if r.get(key) not in (None, "")}}
                for r in csv.DictReader(f)]


def same_run(metrics_a, metrics_b):
    """(equal?, largest difference) over the training rows' COMPARED keys of two metrics.jsonl."""
    rows_a, rows_b = ([r for r in read_metrics(path) if not r.get("eval")] for path in (metrics_a, metrics_b))
    if len(rows_a) != len(rows_b):
        return False, float("inf")
    diffs = [abs(a[key] - b[key]) for a, b in zip(rows_a, rows_b) for key in COMPARED if key in a and key in b]
    return max(diffs, default=0.0) == 0.0, max(diffs, default=0.0)


def report(runs, output_dir):
    """Print the activity table, the eq2 checks and the paired differences -> activity CSV rows."""
    rows = []
    print(f"\n{PRESET}: clip and KL activity over training (mean over steps and seeds; max over them in brackets)")
    print("| config | seeds | clip low | clip high | token-mean ratio | max ratio | KL | ratio exactly 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for config in compare.PRESETS[PRESET]["configs"]:
        mine = [r for r in runs if r["config"] == config]
        if not mine:
            continue
        series = [activity(os.path.join(r["output_dir"], "metrics.jsonl")) for r in mine]
        cells = []
        for key in ACTIVITY:
            values = [v for s in series for _, v in s[key]]
            cells.append(f"{statistics.fmean(values):.4g} [{max(values):.4g}]" if values else "-")
        ones = sum(ratio_is_one(s) for s in series)
        print(f"| {config} | {len(mine)} | " + " | ".join(cells) + f" | {ones} of {len(mine)} runs |")
        for r, s in zip(mine, series):
            for key in ACTIVITY:
                rows += [{"config": config, "seed": r["seed"], "key": key, "step": step, "value": value}
                         for step, value in s[key]]
    for r in (r for r in runs if r["config"].endswith("-eq2")):
        method = r["config"].split("-")[0]
        twin = os.path.join(output_dir, "countdown3-tuning", f"{SWEEP_CELL[method]}-seed{r['seed']}", "metrics.jsonl")
        if os.path.exists(twin):
            equal, diff = same_run(os.path.join(r["output_dir"], "metrics.jsonl"), twin)
            print(f"{r['config']} seed {r['seed']} vs countdown3-tuning {SWEEP_CELL[method]} (clip 0.2/0.28): "
                  + ("identical in every training row" if equal else f"differs, largest difference {diff:.3g}"))
    print("\npaired by seed, 95% t-interval")
    for method in ("grpo", "softmax"):
        base = {r["seed"]: r for r in runs if r["config"] == f"{method}-eq2"}
        for other in ("recipe", "recipe-2mb"):
            mine = [r for r in runs if r["config"] == f"{method}-{other}" and r["seed"] in base]
            if not mine:
                continue
            print(f"{method}-{other} - {method}-eq2 ({len(mine)} seeds): " + "; ".join(
                f"{compare.metric_label(key)} {paired_text([r[key] - base[r['seed']][key] for r in mine])}"
                for key in METRICS if all(key in r and key in base[r["seed"]] for r in mine)))
    return rows


SHIPPED_ACTIVITY = ("clip_frac_low_mean", "clip_frac_high_mean", "ratio_max", "kl_step50", "kl_step150")


def shipped_report(seeds, machine=None):
    """The runs shipped as cells countdown3-eq2-<config>-seed<N> (lab/results/referee_clipping_runs.csv) by one CPU
    (default: this machine's): per config the activity summaries (reproduce.clip_activity) over seeds and the paired
    differences recipe - eq2 -> {config: {seed: {metric: value}}}."""
    from lab import reproduce
    runs = {config: {seed: values for seed in seeds
                     if (values := reproduce.shipped_values(f"{PRESET}-{config}-seed{seed}", machine))}
            for config in compare.PRESETS[PRESET]["configs"]}
    if not any(runs.values()):
        raise reproduce.none_shipped("lab.referee_clipping", "clipping run", reproduce.preset_cells(PRESET), machine,
                                     "--shipped")
    print(f"{PRESET}, shipped: per config, mean over seeds [max over seeds] of each run's activity summary")
    print("| config | seeds | clip low (mean over steps) | clip high | max ratio | KL step 50 | KL step 150 | "
          "every ratio exactly 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for config, by_seed in runs.items():
        if not by_seed:
            continue
        cells = []
        for key in SHIPPED_ACTIVITY:
            values = [v[key] for v in by_seed.values() if key in v]
            cells.append(f"{statistics.fmean(values):.4g} [{max(values):.4g}]" if values else "-")
        ones = sum(v.get("ratio_exactly_one") == 1.0 for v in by_seed.values())
        print(f"| {config} | {len(by_seed)} | " + " | ".join(cells) + f" | {ones} of {len(by_seed)} runs |")
    print("\npaired by seed, 95% t-interval over seeds")
    for method in ("grpo", "softmax"):
        base = runs[f"{method}-eq2"]
        for other in ("recipe", "recipe-2mb"):
            mine = {seed: v for seed, v in runs[f"{method}-{other}"].items() if seed in base}
            if mine:
                print(f"{method}-{other} - {method}-eq2 ({len(mine)} seeds): " + "; ".join(
                    f"{compare.metric_label(key)} {paired_text([v[key] - base[seed][key] for seed, v in mine.items()])}"
                    for key in METRICS if all(key in v and key in base[seed] for seed, v in mine.items())))
    return runs


def plot_shipped(path, runs, title):
    """One panel per activity summary: each config's per-seed values (dots) and their mean (bar)."""
    plt = pyplot("the PNG; the printed table has the numbers")
    if plt is None:
        return False
    configs = [config for config, by_seed in runs.items() if by_seed]
    fig, axes = plt.subplots(1, len(SHIPPED_ACTIVITY), figsize=(3.3 * len(SHIPPED_ACTIVITY), 3.4))
    for ax, key in zip(axes, SHIPPED_ACTIVITY):
        for i, config in enumerate(configs):
            values = [v[key] for v in runs[config].values() if key in v]
            if values:
                ax.bar(i, statistics.fmean(values), color=f"C{i % 3}", alpha=0.5 if config.startswith("grpo") else 0.9)
                ax.scatter([i] * len(values), values, s=10, color="black")
        ax.set_xticks(range(len(configs)), configs, rotation=60, ha="right", fontsize=7)
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    return save_figure(plt, fig, path, title)


def plot(path, rows, title):
    plt = pyplot("the PNG; the CSV has the numbers")
    if plt is None or not rows:
        return False
    fig, axes = plt.subplots(1, len(ACTIVITY), figsize=(3.4 * len(ACTIVITY), 3.2))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    for ax, key in zip(axes, ACTIVITY):
        for i, config in enumerate(configs):
            by_step = {}
            for r in rows:
                if r["config"] == config and r["key"] == key:
                    by_step.setdefault(r["step"], []).append(r["value"])
            if by_step:
                steps = sorted(by_step)
                ax.plot(steps, [statistics.fmean(by_step[s]) for s in steps], color=f"C{i}", lw=1,
                        linestyle="-" if config.startswith("softmax") else "--", label=config)
        ax.set_title(key + " (mean over seeds)", fontsize=9)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(plt, fig, path, title)


def main(argv=None):
    parser = sweep_parser(__doc__)
    parser.add_argument("--summary-only", action="store_true", help="train nothing: the runs in "
                        "<output-dir>/countdown3-eq2_runs.csv")
    parser.add_argument("--shipped", nargs="?", const="", metavar="MACHINE", help="train nothing: the runs shipped "
                        "in lab/results/referee_clipping_runs.csv from this CPU (or the CPU whose machine contains "
                        "MACHINE), the figure drawn into lab/figures/")
    args, extra = parser.parse_known_args(argv)
    if args.shipped is not None:
        runs = shipped_report([int(s) for s in args.seeds.split(",") if s.strip()], args.shipped or None)
        if plot_shipped(FIGURE, runs, f"{PRESET}: clip and KL activity per run (dots: seeds; bars: mean)"):
            print(f"drew {FIGURE}")
        return runs
    csv_path = os.path.join(args.output_dir, f"{PRESET}_runs.csv")
    if not args.summary_only:
        compare.main(["--preset", PRESET, "--seeds", args.seeds, "--output-dir", args.output_dir, *extra])
    if not os.path.exists(csv_path):
        parser.error(f"{csv_path}: no runs yet (run without --summary-only first)")
    runs = read_runs(csv_path)
    rows = report(runs, args.output_dir)
    write_csv(os.path.join(args.output_dir, f"{PRESET}_activity.csv"), rows)
    drew = plot(os.path.join(args.output_dir, f"{PRESET}_activity.png"), rows,
                f"{PRESET}: clip fractions, ratio, KL over training ({len(runs)} runs; solid softmax, dashed grpo)")
    print(f"wrote {args.output_dir}/{PRESET}_activity.csv" + (f" and {PRESET}_activity.png" if drew else ""))
    return runs, rows


if __name__ == "__main__":
    main()
