"""A compare preset's shipped cells read back (lab.reproduce reruns and ships them): per config each metric's mean ±
SE over seeds, each config minus the first paired by seed, and Lopti's Fig. 3 over the seeds of countdown3-lopti.

    python -m lab.summary countdown3-lopti --machine "AMD EPYC, avx512" --figure fig3.png   # default: this CPU's rows
"""
import argparse

from experiments import write_figure
from lab.ledger import cpu_kind, this_machine
from lab.reproduce import CELLS, none_shipped, preset_cells, shipped_values


def summary(preset, machine=None, metrics=None, figure=None):
    """Print a preset's shipped cells of one CPU (see the module's docstring).
    -> {config: {seed: {metric: value}}}."""
    from lab.seed_stats import mean_se, mean_se_interval, paired_text
    runs, names = {}, preset_cells(preset)
    for name in names:
        if values := shipped_values(name, machine):
            runs.setdefault(CELLS[name][1][1], {})[int(CELLS[name][1][2])] = values
    if not runs:
        raise none_shipped("lab.summary", f"cell of {preset}", names, machine)
    keys = metrics or [key for key in ("before_pass@1", "after_pass@1") + tuple(
        f"sampled_pass@{k}" for k in (1, 2, 4, 8, 16)) if any(key in v for c in runs.values() for v in c.values())]
    print(f"{preset}: mean ± SE over seeds (n per config in brackets); shipped rows of "
          + (machine or cpu_kind(this_machine())))
    print("| config | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for config, by_seed in runs.items():
        print(f"| {config} ({len(by_seed)}) | " + " | ".join(
            mean_se([v[key] for v in by_seed.values() if key in v]) for key in keys) + " |")
    base_name, base = next(iter(runs.items()))
    for config, by_seed in list(runs.items())[1:]:
        seeds = sorted(set(by_seed) & set(base))
        texts = []
        for key in keys:
            diff = [by_seed[s][key] - base[s][key] for s in seeds if key in by_seed[s] and key in base[s]]
            if diff:
                _, _, interval = mean_se_interval(diff)
                held = interval is not None and interval[0] <= 0 <= interval[1]
                texts.append(f"{key} {paired_text(diff)}" + (" (holds 0)" if held else ""))
        print(f"{config} − {base_name}, paired by seed, n = {len(seeds)}, 95% t-interval over seeds: "
              + "; ".join(texts))
    fig3_summary(runs.get("grpo", {}), figure)  # countdown3-lopti's grpo cells carry Fig. 3
    return runs


def fig3_summary(by_seed, figure=None):
    """Lopti's Fig. 3 over seeds from the grpo cells' fig3_<method>_Q<q>_pos_rose_share metrics;
    with `figure`, a bar chart. -> {method: [[per-seed shares] for Q1..Q4]}."""
    from experiments import mean_sd_se
    from lab.seed_stats import mean_se_interval
    methods = list(dict.fromkeys(key.split("_")[1] for values in by_seed.values() for key in values
                                 if key.startswith("fig3_") and key.endswith("_pos_rose_share")))
    if "grpo" not in methods:
        return {}
    methods = ["grpo"] + [m for m in methods if m != "grpo"]  # the baseline first, the others minus it
    key = "fig3_{}_Q{}_pos_rose_share".format
    shares = {m: [[v[key(m, q)] for v in by_seed.values() if key(m, q) in v] for q in range(1, 5)] for m in methods}
    print(f"\nFig. 3 on each seed's final GRPO policy, n = {len(by_seed)} seeds: share of A > 0 tokens whose "
          "probability rose after one update, mean ± SD over seeds; minus GRPO on the same seed, mean ± SE "
          "[95% t-interval over seeds]")
    print("| update | Q1 | Q2 | Q3 | Q4 |\n|---|---|---|---|---|")
    for m in methods:
        cells = []
        for q in range(4):
            mean, sd, _ = mean_sd_se(shares[m][q])
            cells.append(f"{mean:.2f}" + ("" if sd is None else f" ± {sd:.2f}"))
        print(f"| {m} | " + " | ".join(cells) + " |")
    for m in methods[1:]:
        texts = []
        for q in range(1, 5):
            diff = [v[key(m, q)] - v[key("grpo", q)] for v in by_seed.values()
                    if key(m, q) in v and key("grpo", q) in v]
            mean, se, interval = mean_se_interval(diff)
            texts.append(f"Q{q} {mean:+.3f}" + ("" if se is None else f" ± {se:.3f} [{interval[0]:+.3f}, "
                                                                      f"{interval[1]:+.3f}]"))
        print(f"{m} − grpo: " + ", ".join(texts))
    if figure:
        from experiments import pyplot
        plt = pyplot("the figure; the printed table has the numbers")
        if plt is not None:
            fig, ax = plt.subplots(figsize=(6, 3.8))
            width = 0.8 / len(methods)
            for i, m in enumerate(methods):
                stats = [mean_sd_se(values) for values in shares[m]]
                ax.bar([q + (i - (len(methods) - 1) / 2) * width for q in range(4)], [mean for mean, _, _ in stats],
                       width, yerr=[sd or 0 for _, sd, _ in stats], capsize=2, label=m)
            ax.set_xticks(range(4), [f"Q{q}" for q in range(1, 5)])
            ax.set_ylim(0, 1)
            ax.set_xlabel("p_old quartile (Q1 lowest)")
            ax.set_ylabel("share of A > 0 tokens whose prob. rose")
            ax.set_title(f"Lopti Fig. 3 on the final GRPO policies (mean of {len(by_seed)} seeds, bars: SD)",
                         fontsize=9)
            ax.legend(fontsize=8)
            fig.tight_layout()
            write_figure(fig, figure, dpi=120)
            plt.close(fig)
            print(f"drew {figure}")
    return shares


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lab.summary", description=__doc__.split("\n")[0])
    parser.add_argument("preset", help="a compare preset whose cells were shipped (e.g. countdown3, countdown3-lopti)")
    parser.add_argument("--machine", help="the rows of the CPU whose machine contains this (default: this CPU's)")
    parser.add_argument("--figure", help="countdown3-lopti: draw Fig. 3 over the seeds here")
    args = parser.parse_args(argv)
    summary(args.preset, args.machine, figure=args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
