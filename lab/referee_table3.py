"""The SoftmaxGRPO referee's Table 3 question (issue 30, item 3): Table 3 at three points of training, over seeds.

    python -m lab.referee_table3                  # steps 50, 100, 150 of the sweep's M 8 runs, seeds 0,1,2
    python -m lab.referee_table3 --steps 100,150 --seeds 0,1
    python -m lab.referee_table3 --shipped        # lab/referees.md's numbers and figure, from the shipped rows

The protocol is DESIGN.md section 7's: lab.referee_tuning's grpo-M8 and softmax-M8-tau0.1 runs, each kept
checkpoint-<step> scored by lab.compare.table3_over_runs (256 held-out prompts x 16 samples; p = k / 16; a bin's
share of the budget sum_i |A_i| len_i). Printed per step, the measured part (lab.headline.table3_measured): each
trained policy's prompts per pass-rate bin and each method's share on its own policy, mean +- SE over seeds,
differences paired by seed with 95% t-intervals. A run or step not yet there is left out and counted.

Writes <output-dir>/countdown3-tuning_table3_steps.csv (one row per step, policy, seed and bin: both estimators'
shares) and, with matplotlib, countdown3-tuning_table3_steps.png (the measured part vs step, SE bars).
Numbers: lab/referees.md.
"""
import argparse
import os

from experiments import pyplot, save_figure, write_csv

from lab import compare, headline, reproduce
from lab.seed_stats import mean_se_interval
from experiments.table3_allocation import BIN_NAMES

PRESET = "countdown3-tuning"
CONFIGS = ("grpo-M8", "softmax-M8-tau0.1")  # train.py's countdown3 recipe, both methods
FIGURE = os.path.join(reproduce.REPO, "lab", "figures", "referee_table3_steps.png")


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


def by_seed_of(rows, step):
    """One step's rows -> {"grpo"|"softmax": {seed: {table3_<kind>_<bin>: value}}}, as lab.headline reads its
    shipped seeds (the trained policy's method; the shares under both estimators)."""
    by_seed = {"grpo": {}, "softmax": {}}
    for r in rows:
        if r["step"] == step:
            values = by_seed["grpo" if r["config"].startswith("grpo") else "softmax"].setdefault(int(r["seed"]), {})
            values.update({f"table3_prompts_{r['bin']}": r["prompts"],
                           f"table3_share_grpo_adv_{r['bin']}": r["share_grpo_advantages"],
                           f"table3_share_softmax_adv_{r['bin']}": r["share_softmax_advantages"]})
    both = sorted(set(by_seed["grpo"]) & set(by_seed["softmax"]))
    return {method: {seed: by_seed[method][seed] for seed in both} for method in by_seed}


def summary(rows):
    """Print, per step, Table 3's measured part (lab.headline.table3_measured): the two trained policies'
    prompts per pass-rate bin and each method's own budget share, paired by seed. The two estimators' shares on the
    same samples are not compared: they differ by an identity (DESIGN.md section 7)."""
    for step in sorted({r["step"] for r in rows}):
        headline.table3_measured(by_seed_of(rows, step), f"the checkpoints of step {step}")


def shipped_rows(seeds, steps, machine=None):
    """The rows summary and plot take, from the cells countdown3-tuning-<grpo-M8|softmax-M8-tau0.1>-seed<N> shipped
    in lab/results/referee_tuning_runs.csv (metrics table3_step<N>_*) by one CPU (default: this machine's)."""
    rows = []
    for seed in seeds:
        for config in CONFIGS:
            values = reproduce.shipped_values(f"{PRESET}-{config}-seed{seed}", machine)
            for step in steps:
                for name in BIN_NAMES:
                    if f"table3_step{step}_prompts_{name}" in values:
                        rows.append({"step": step, "config": config, "seed": seed, "bin": name, **{
                            key: values[f"table3_step{step}_{short}_{name}"] for key, short in
                            (("prompts", "prompts"), ("share_grpo_advantages", "share_grpo_adv"),
                             ("share_softmax_advantages", "share_softmax_adv"))}})
    return rows


def plot(path, rows, title):
    """Left: prompts per pass-rate bin vs step, per trained policy; right: each method's budget share on its own
    policy under its own advantages; mean +- SE over seeds (the measured part; no same-samples comparison)."""
    plt = pyplot("the PNG; the CSV has the numbers")
    if plt is None or not rows:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    steps = sorted({r["step"] for r in rows})
    for config, style in zip(CONFIGS, ("--", "-")):
        own = "share_grpo_advantages" if config.startswith("grpo") else "share_softmax_advantages"
        for b, name in enumerate(BIN_NAMES):
            for ax, key in zip(axes, ("prompts", own)):
                stats = [mean_se_interval([r[key] for r in rows if r["step"] == s and r["config"] == config
                                           and r["bin"] == name] or [float("nan")]) for s in steps]
                ax.errorbar(steps, [m for m, _, _ in stats], yerr=[se or 0 for _, se, _ in stats], color=f"C{b}",
                            linestyle=style, marker="o", capsize=3, label=f"{name}, trained with {config}")
    axes[0].set_ylabel("prompts of 256 (mean ± SE over seeds)")
    axes[1].set_ylabel("own budget share (mean ± SE over seeds)")
    for ax in axes:
        ax.set_xlabel("RL step of the checkpoint")
        ax.set_xticks(steps)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))
    return save_figure(plt, fig, path, title)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Any other flag is read as one of the runs' train.py flags (e.g. the "
                                            "small settings a test trained them with).")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", default="50,100,150")
    parser.add_argument("--output-dir", default="runs/referees", help="lab.referee_tuning's output dir")
    parser.add_argument("-M", type=int, default=16, help="samples per held-out prompt")
    parser.add_argument("--shipped", nargs="?", const="", metavar="MACHINE", help="score nothing: the rows shipped "
                        "in lab/results/referee_tuning_runs.csv from this CPU (or the CPU whose machine contains "
                        "MACHINE), the figure drawn into lab/figures/")
    args, extra = parser.parse_known_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds / --steps: expected comma-separated integers, got {args.seeds!r} / {args.steps!r}")
    title = (f"Table 3 at steps {args.steps}: prompts per pass-rate bin and each method's own budget share "
             "(dashed: GRPO-trained, solid: SoftmaxGRPO-trained)")
    if args.shipped is not None:
        rows = shipped_rows(seeds, steps, args.shipped or None)
        if not rows:
            raise reproduce.none_shipped("lab.referee_table3", "Table 3 at steps", reproduce.preset_cells(PRESET),
                                         args.shipped, "--shipped")
        summary(rows)
        if plot(FIGURE, rows, title):
            print(f"drew {FIGURE}")
        return rows
    rows = []
    for step in steps:
        runs, missing = available_runs(args.output_dir, seeds, step)
        print(f"\n=== step {step}: {len(runs)} of {len(runs) + missing} runs have checkpoint-{step}"
              + (" (rerun after lab.referee_tuning has trained the others)" if missing else ""), flush=True)
        if runs:
            rows += [{"step": step, **r} for r in compare.table3_over_runs(
                PRESET, runs, args.output_dir, extra, M=args.M, checkpoint=f"checkpoint-{step}",
                label=f"{PRESET}_table3_step{step}")]
    if not rows:
        parser.error(f"no run in {args.output_dir}/{PRESET} has the checkpoints yet (run lab.referee_tuning)")
    print()
    summary(rows)
    write_csv(os.path.join(args.output_dir, f"{PRESET}_table3_steps.csv"), rows)
    drew = plot(os.path.join(args.output_dir, f"{PRESET}_table3_steps.png"), rows, title)
    print(f"wrote {args.output_dir}/{PRESET}_table3_steps.csv" + (f" and {PRESET}_table3_steps.png" if drew else ""))
    return rows


if __name__ == "__main__":
    main()
