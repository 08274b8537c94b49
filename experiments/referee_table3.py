"""The SoftmaxGRPO referee's Table 3 question (issue 30, item 3): Table 3 at three points of training, over seeds.

    python -m experiments.referee_table3                  # steps 50, 100, 150 of the sweep's M 8 runs, seeds 0,1,2
    python -m experiments.referee_table3 --steps 100,150 --seeds 0,1

The protocol (DESIGN.md section 7 states it): the policies are experiments.referee_tuning's countdown3-tuning runs
of train.py's countdown3 recipe, GRPO (grpo-M8) and SoftmaxGRPO tau 0.1 (softmax-M8-tau0.1), 150 steps of 64
prompts x M 8 under the unclipped-in-effect on-policy surrogate (one epoch, one mini-batch, no KL); at each step
their checkpoint-<step> (kept: --keep-checkpoints 0) is scored by experiments.table3_allocation through
experiments.compare.table3_over_runs: 256 held-out prompts x 16 samples at temperature 1, torch seeded with the
run's seed; p = k / 16; both estimators' advantages (GRPO z-score, SoftmaxGRPO tau 0.1) on the same samples; a
prompt's budget sum_i |A_i| len_i; a bin's share = its budget / the total. Aggregated: per (step, trained policy,
bin) the mean +- SE over seeds of each run's share, and the hardest bin's SoftmaxGRPO - GRPO share paired on the
same samples with its 95% t-interval. A run not yet trained (or a step not yet saved) is left out and counted.

Writes <output-dir>/countdown3-tuning_table3_steps.csv (one row per step, policy, seed and bin) and, with matplotlib,
countdown3-tuning_table3_steps.png (each bin's share vs step, per trained policy and estimator, SE bars).
Numbers: docs/results.md.
"""
import argparse
import os

from experiments import compare, pyplot, save_figure
from experiments.seed_stats import mean_se_interval, paired_text
from experiments.table3_allocation import BIN_NAMES

PRESET = "countdown3-tuning"
CONFIGS = ("grpo-M8", "softmax-M8-tau0.1")  # train.py's countdown3 recipe, both methods


def available_runs(output_dir, seeds, step):
    """The runs of CONFIGS x seeds whose checkpoint-<step> exists -> ([{config, seed, output_dir}], missing count)."""
    runs, missing = [], 0
    for seed in seeds:
        for config in CONFIGS:
            run_dir = os.path.join(output_dir, PRESET, f"{config}-seed{seed}")
            if os.path.isdir(os.path.join(run_dir, f"checkpoint-{step}")) and \
                    os.path.exists(os.path.join(run_dir, "latest", "run.json")):
                runs.append({"config": config, "seed": seed, "output_dir": run_dir})
            else:
                missing += 1
    return runs, missing


def summary(rows):
    """Print per step and trained policy the hardest bin's paired difference; -> the same as (step, config, text)."""
    lines = []
    for step in dict.fromkeys(r["step"] for r in rows):
        for config in CONFIGS:
            hardest = [r["share_softmax_advantages"] - r["share_grpo_advantages"] for r in rows
                       if r["step"] == step and r["config"] == config and r["bin"] == BIN_NAMES[0]]
            if hardest:
                lines.append((step, config, paired_text(hardest)))
                print(f"step {step}, {config} policies ({len(hardest)} seeds): hardest bin {BIN_NAMES[0]} share, "
                      f"SoftmaxGRPO's advantages - GRPO's, paired, 95% t-interval: {paired_text(hardest)}")
    return lines


def plot(path, rows, title):
    plt = pyplot("the PNG; the CSV has the numbers")
    if plt is None or not rows:
        return False
    fig, axes = plt.subplots(1, len(CONFIGS), figsize=(5.2 * len(CONFIGS) + 2.4, 3.6), sharey=True)
    steps = sorted({r["step"] for r in rows})
    for ax, config in zip(axes, CONFIGS):
        for b, name in enumerate(BIN_NAMES):
            for key, style in (("share_grpo_advantages", "--"), ("share_softmax_advantages", "-")):
                stats = [mean_se_interval([r[key] for r in rows if r["step"] == s and r["config"] == config
                                           and r["bin"] == name] or [float("nan")]) for s in steps]
                ax.errorbar(steps, [m for m, _, _ in stats], yerr=[se or 0 for _, se, _ in stats], color=f"C{b}",
                            linestyle=style, marker="o", capsize=3,
                            label=f"{name}, {'SoftmaxGRPO' if 'softmax' in key else 'GRPO'} advantages")
        ax.set_title(f"policy trained with {config}", fontsize=9)
        ax.set_xlabel("RL step of the checkpoint")
        ax.set_xticks(steps)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of the token budget (mean ± SE)")
    axes[-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))
    return save_figure(plt, fig, path, title)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Any other flag is read as one of the runs' train.py flags (e.g. the "
                                            "small settings a test trained them with).")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", default="50,100,150")
    parser.add_argument("--output-dir", default="runs/referees", help="experiments.referee_tuning's output dir")
    parser.add_argument("-M", type=int, default=16, help="samples per held-out prompt")
    args, extra = parser.parse_known_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds / --steps: expected comma-separated integers, got {args.seeds!r} / {args.steps!r}")
    rows = []
    for step in steps:
        runs, missing = available_runs(args.output_dir, seeds, step)
        print(f"\n=== step {step}: {len(runs)} of {len(runs) + missing} runs have checkpoint-{step}"
              + (" (rerun after experiments.referee_tuning has trained the others)" if missing else ""), flush=True)
        if runs:
            rows += [{"step": step, **r} for r in compare.table3_over_runs(
                PRESET, runs, args.output_dir, extra, M=args.M, checkpoint=f"checkpoint-{step}",
                label=f"{PRESET}_table3_step{step}")]
    if not rows:
        parser.error(f"no run in {args.output_dir}/{PRESET} has the checkpoints yet (run experiments.referee_tuning)")
    print()
    summary(rows)
    compare.write_csv(os.path.join(args.output_dir, f"{PRESET}_table3_steps.csv"), rows)
    drew = plot(os.path.join(args.output_dir, f"{PRESET}_table3_steps.png"), rows,
                f"Table 3 at steps {args.steps}: token-budget share per pass-rate bin (solid: SoftmaxGRPO's "
                "advantages, dashed: GRPO's; the same samples)")
    print(f"wrote {args.output_dir}/{PRESET}_table3_steps.csv" + (f" and {PRESET}_table3_steps.png" if drew else ""))
    return rows


if __name__ == "__main__":
    main()
