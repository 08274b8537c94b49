"""The SoftmaxGRPO referee's fair-tuning question (issue 30, item 1): the same tuning grid and budget for both methods.

    OMP_NUM_THREADS=1 python -m lab.referee_tuning              # seeds 0,1,2 -> runs/referees (~45 runs)
    python -m lab.referee_tuning --summary-only                 # the grid from the runs finished so far
    python -m lab.referee_tuning --shipped        # the grid lab/referees.md shows, from its shipped rows
                                                          # (lab/results/referee_tuning_runs.csv)

The headline (M, tau) = (8, 0.1) is the best cell of the paper's sweep while GRPO got one configuration. Here both
get a grid (lab.compare's preset countdown3-tuning; a finished run is reused): GRPO over M in {4, 8, 16},
SoftmaxGRPO over M x tau in {0.05, 0.1, 0.3, 1.0}; every cell 150 steps of 512 samples, the same lr, seeds, warm
starts and held-out prompts.

Per cell: held-out greedy pass@1 (train.py's final eval, 200 prompts) and sampled pass@k from 16 samples per
held-out prompt for every cell (unbiased estimator), mean +- SE over seeds. Each method's best cell (the highest
mean of --select) against the other's best: the paired difference over the seeds both have, with its 95%
t-interval. Picking the best of 12 SoftmaxGRPO cells vs 3 GRPO cells on the same seeds favours SoftmaxGRPO (winner's
curse); the script also prints the paired difference of the two fixed recipes (M 8: tau 0.1 vs GRPO), which is
not selected. Writes <output-dir>/countdown3-tuning_grid.csv and countdown3-tuning_grid.png (the Table-5-style
heat maps: rows tau or GRPO, columns M, one panel per metric). Numbers: lab/referees.md.
"""
import argparse
import csv
import os
import statistics

from experiments import pyplot, save_figure, write_csv

from lab import compare
from lab.seed_stats import mean_se, mean_se_interval, paired_text

PRESET = "countdown3-tuning"
FIGURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures", "referee_tuning_grid.png")
METRICS = ("after_pass@1", "sampled_pass@1", "sampled_pass@4", "sampled_pass@16")


def read_runs(path):
    """<output-dir>/countdown3-tuning_runs.csv -> [{config, seed, metric: float}] (the runs compare has finished)."""
    with open(path) as f:
        return [{"config": r["config"], "seed": int(r["seed"]), "seconds": float(r["seconds"]),
                 "reused": r["reused"] == "True",
                 **{key: float(r[key]) for key in METRICS if r.get(key) not in (None, "")}}
                for r in csv.DictReader(f)]


def shipped_runs(seeds, machine=None):
    """The grid's runs as read_runs gives them, from the rows shipped in lab/results/referee_tuning_runs.csv (cells
    countdown3-tuning-<config>-seed<N>, one row per metric) by one CPU (`machine`: a substring of the rows' machine;
    default this machine's CPU kind). A run not shipped from that CPU is left out."""
    from lab import reproduce
    runs = []
    for seed in seeds:
        for config in compare.PRESETS[PRESET]["configs"]:
            values = reproduce.shipped_values(f"{PRESET}-{config}-seed{seed}", machine)
            if values:
                runs.append({"config": config, "seed": seed, **{key: values[key] for key in METRICS if key in values}})
    return runs


def cell_of(config):
    """'softmax-M8-tau0.1' -> ('softmax', 8, 0.1); 'grpo-M4' -> ('grpo', 4, None)."""
    method, M, *tau = config.split("-")
    return method, int(M[1:]), float(tau[0][3:]) if tau else None


def grid(runs):
    """Per config: {config, method, M, tau, seeds, metric: [per-seed values]} in the preset's order."""
    cells = []
    for config in compare.PRESETS[PRESET]["configs"]:
        mine = sorted((r for r in runs if r["config"] == config), key=lambda r: r["seed"])
        if mine:
            method, M, tau = cell_of(config)
            cells.append({"config": config, "method": method, "M": M, "tau": tau,
                          "seeds": [r["seed"] for r in mine],
                          **{key: [r[key] for r in mine if key in r] for key in METRICS}})
    return cells


def best(cells, method, select):
    """The cell of `method` with the highest mean of `select` (None if it has no runs)."""
    mine = [c for c in cells if c["method"] == method and c[select]]
    return max(mine, key=lambda c: statistics.fmean(c[select]), default=None)


def paired(a, b, key):
    """Per-seed differences a - b of `key` over the seeds both cells have."""
    values_b = dict(zip(b["seeds"], b[key]))
    return [value - values_b[seed] for seed, value in zip(a["seeds"], a[key]) if seed in values_b]


def report(cells, select, total):
    """Print the grid (mean +- SE), the best cells and their paired differences -> CSV rows."""
    done = sum(len(c["seeds"]) for c in cells)
    print(f"\n{PRESET}: {done} of {total} runs done" + ("" if done >= total else
                                                      " (rerun the command to continue; finished runs are reused)"))
    print("| cell | seeds | " + " | ".join(compare.metric_label(key) for key in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    rows = []
    for c in cells:
        print(f"| {c['config']} | {len(c['seeds'])} | " + " | ".join(mean_se(c[key]) if c[key] else ""
                                                                      for key in METRICS) + " |")
        row = {"config": c["config"], "method": c["method"], "M": c["M"], "tau": c["tau"] or "",
               "seeds": len(c["seeds"])}
        for key in METRICS:
            mean, se, _ = mean_se_interval(c[key]) if c[key] else (None, None, None)
            row.update({f"{key}_mean": "" if mean is None else round(mean, 4),
                        f"{key}_se": "" if se is None else round(se, 4)})
        rows.append(row)
    top = {method: best(cells, method, select) for method in ("softmax", "grpo")}
    fixed = {c["config"]: c for c in cells if c["config"] in ("softmax-M8-tau0.1", "grpo-M8")}
    pairs = [("best SoftmaxGRPO", top["softmax"], "best GRPO", top["grpo"]),
             ("SoftmaxGRPO M8 tau0.1", fixed.get("softmax-M8-tau0.1"), "GRPO M8", fixed.get("grpo-M8"))]
    for name_a, a, name_b, b in pairs:
        if a is None or b is None:
            continue
        print(f"{name_a} ({a['config']}) - {name_b} ({b['config']}), paired by seed, 95% t-interval"
              + (f" (best by mean {compare.metric_label(select)})" if name_a.startswith("best") else "") + ": "
              + "; ".join(f"{compare.metric_label(key)} {paired_text(paired(a, b, key))}"
                          for key in METRICS if paired(a, b, key)))
    return rows


def plot(path, cells, title):
    """The Table-5-style heat maps: rows tau (SoftmaxGRPO) then GRPO, columns M; the cell's mean +- SE written in it.
    -> written?"""
    plt = pyplot("the heat map; the CSV has the numbers")
    if plt is None:
        return False
    import numpy as np
    Ms = sorted({c["M"] for c in cells})
    rows = [tau for tau in compare.TUNING_TAUS if any(c["tau"] == tau for c in cells)]
    rows = sorted(rows) + (["GRPO"] if any(c["method"] == "grpo" for c in cells) else [])
    keys = ("after_pass@1", "sampled_pass@1", "sampled_pass@16")
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6))
    for ax, key in zip(axes, keys):
        values = np.full((len(rows), len(Ms)), np.nan)
        labels = [[""] * len(Ms) for _ in rows]
        for c in cells:
            if not c[key]:
                continue
            i, j = rows.index("GRPO" if c["method"] == "grpo" else c["tau"]), Ms.index(c["M"])
            mean, se, _ = mean_se_interval(c[key])
            values[i, j] = mean
            labels[i][j] = f"{mean:.3f}" + ("" if se is None else f"\n±{se:.3f}") + f"\n(n={len(c[key])})"
        image = ax.imshow(values, cmap="viridis", aspect="auto")
        low, high = (np.nanmin(values), np.nanmax(values)) if not np.isnan(values).all() else (0.0, 0.0)
        for i in range(len(rows)):
            for j in range(len(Ms)):
                bright = high > low and (values[i, j] - low) / (high - low) > 0.6  # viridis turns yellow
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=7, color="black" if bright else "white")
        ax.set_xticks(range(len(Ms)), [f"M={M}" for M in Ms])
        ax.set_yticks(range(len(rows)), [f"tau={r}" if r != "GRPO" else "GRPO" for r in rows])
        ax.set_title(compare.metric_label(key) + " (mean ± SE over seeds)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    return save_figure(plt, fig, path, title)


def sweep_parser(doc):
    """The flags the referee sweeps share (--seeds, --output-dir); any other flag goes on to lab.compare."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Any other flag is passed to lab.compare (and so to train.py).")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--output-dir", default="runs/referees")
    return parser


def main(argv=None):
    parser = sweep_parser(__doc__)
    parser.add_argument("--select", default="after_pass@1", choices=METRICS,
                        help="the metric whose mean picks each method's best cell")
    parser.add_argument("--configs", default=None, help="comma-separated subset of the grid's cells")
    parser.add_argument("--summary-only", action="store_true", help="train nothing: the grid of the runs in "
                        "<output-dir>/countdown3-tuning_runs.csv (e.g. while the sweep still runs)")
    parser.add_argument("--shipped", nargs="?", const="", metavar="MACHINE", help="train nothing: the grid of the rows "
                        "shipped in lab/results/referee_tuning_runs.csv from this CPU (or the CPU whose machine "
                        "contains MACHINE), its figure drawn into lab/figures/")
    args, extra = parser.parse_known_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.shipped is not None:
        runs = shipped_runs(seeds, args.shipped or None)
        if not runs:
            from lab import reproduce
            raise reproduce.none_shipped("lab.referee_tuning", "run of the grid", reproduce.preset_cells(PRESET),
                                         args.shipped, "--shipped")
    else:
        csv_path = os.path.join(args.output_dir, f"{PRESET}_runs.csv")
        if not args.summary_only:
            compare.main(["--preset", PRESET, "--seeds", args.seeds, "--output-dir", args.output_dir, *extra]
                         + (["--configs", args.configs] if args.configs else []))
        if not os.path.exists(csv_path):
            parser.error(f"{csv_path}: no runs yet (run without --summary-only first)")
        runs = read_runs(csv_path)
    cells = grid(runs)
    configs = args.configs.split(",") if args.configs else compare.PRESETS[PRESET]["configs"]
    total = len(configs) * len(seeds)
    rows = report(cells, args.select, total)
    done = sum(len(c["seeds"]) for c in cells)
    title = f"{PRESET}: held-out pass@k per cell, 512 samples/step, 150 steps ({done} runs)"
    if args.shipped is not None:  # the numbers are the shipped file's; only the figure is drawn
        if plot(FIGURE, cells, title):
            print(f"drew {FIGURE}")
        return cells
    write_csv(os.path.join(args.output_dir, f"{PRESET}_grid.csv"), rows)
    drew = plot(os.path.join(args.output_dir, f"{PRESET}_grid.png"), cells, title)
    print(f"wrote {args.output_dir}/{PRESET}_grid.csv" + (f" and {PRESET}_grid.png" if drew else ""))
    return cells


if __name__ == "__main__":
    main()
