"""Training comparisons over seeds: train.py configurations side by side, mean +- std of held-out pass@1.

    python -m experiments.compare                          # preset countdown: GRPO vs SoftmaxGRPO, 3 seeds (CPU)
    python -m experiments.compare --preset kk              # K&K: GRPO vs AR vs Lopti vs AR+Lopti
    python -m experiments.compare --seeds 0,1,2,3,4 --steps 100 --prompts-per-step 32   # extra flags -> train.py

Every run is `train.main([...])` in this process with --task, --seed, --output-dir <output-dir>/<preset>/<config>-
seed<s>, then the preset's shared flags, then the config's flags, then your extra flags (last wins). The score is
the final greedy pass@1 on the --eval-size held-out prompts ("after"); "before" is the same evaluation of the
starting policy, identical across configs of a seed. The table gives mean +- sample std over seeds, and each
config's paired difference to the preset's first config (same seed = same warm start, same prompts).

Presets (method flags; everything else is train.py's default unless listed):
  countdown  task countdown;       grpo: --method grpo;  softmax: --method softmax --tau 0.1
  kk         task knights_knaves, shared --method grpo --temperature 0.7 --clip-high 0.24 --dual-clip 10 (Lopti
             paper); grpo: -; ar: --alpha 0.2; lopti: --lopti-eta 0.4; ar+lopti: --alpha 0.3 --lopti-eta 0.5
             (the paper's values for each variant alone and combined, DESIGN.md section 1)
CPU default (tiny model): train.py's own defaults (100 steps x 64 prompts x M=8; Countdown with 2 numbers), so
`python -m experiments.compare` (3 seeds x 2 configs) took 15 minutes on 2 shared cores (OMP_NUM_THREADS=1).
The tiny model's warm start is cached per (task, seed, warm-start settings) under <output-dir>/warm_start/ (train.py's --warm-start-cache) and
linked into every run of that seed, so each seed trains it once; it is deterministic in the seed, so reusing it
changes nothing but the time.
K&K with the tiny model: the compact prompt codes each statement ("a:b1*c0,b:-a1,..."), the answer is one digit
per person ("101"), with no room to reason. Supervised warm start of the 2M-parameter model stays near chance
(numbers: docs/experiments.md), so the kk preset on a CPU is a smoke test of the pipeline, not evidence about
AR/Lopti; `--task-option people=3` keeps it short.

GPU-size settings (one H100/H200; hours, not minutes), e.g.
  --preset countdown --seeds 0,1,2 --model Qwen/Qwen2.5-1.5B-Instruct --steps 200 --prompts-per-step 64
      --max-new-tokens 1024 --kl-coef 1e-3 --lr 1e-6 --eval-size 500 --micro-batch 16        (SoftmaxGRPO paper)
  --preset kk --seeds 0,1,2 --model Qwen/Qwen2.5-3B-Instruct --steps 300 --prompts-per-step 64
      --max-new-tokens 2048 --kl-coef 1e-3 --lr 1e-6 --eval-size 500 --micro-batch 8         (Lopti paper)
Writes <output-dir>/<preset>_runs.csv (one row per run) and <output-dir>/<preset>_summary.csv.
"""
import argparse
import csv
import json
import os
import statistics
import time

import train
from config import parse_args

PRESETS = {
    "countdown": dict(task="countdown", shared=[],
                      configs={"grpo": ["--method", "grpo"], "softmax": ["--method", "softmax", "--tau", "0.1"]}),
    "kk": dict(task="knights_knaves",
               shared=["--method", "grpo", "--temperature", "0.7", "--clip-high", "0.24", "--dual-clip", "10"],
               configs={"grpo": [], "ar": ["--alpha", "0.2"], "lopti": ["--lopti-eta", "0.4"],
                        "ar+lopti": ["--alpha", "0.3", "--lopti-eta", "0.5"]}),
}
CPU_DEFAULTS = []  # train.py's own defaults are CPU-sized for the tiny model


def run_argv(preset, config, seed, output_dir, extra):
    """The train.py argument list of one run (later flags override earlier ones)."""
    spec = PRESETS[preset]
    run_dir = os.path.join(output_dir, preset, f"{config}-seed{seed}")
    return ["--task", spec["task"], "--seed", str(seed), "--output-dir", run_dir, "--overwrite", *CPU_DEFAULTS,
            *spec["shared"], "--warm-start-cache", os.path.join(output_dir, "warm_start"), *spec["configs"][config],
            *extra]  # --overwrite: a comparison run again replaces its own runs


def last_train_pass_rate(metrics_path, last=10):
    """Mean training-batch pass rate over the last `last` RL steps of a metrics.jsonl (None if no step ran)."""
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rates = [r["pass_rate"] for r in rows if not r.get("eval")][-last:]
    return sum(rates) / len(rates) if rates else None


def mean_std(values):
    """'mean +- std' with the sample std (n - 1); a single value has no std."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def summarize(runs, configs):
    """Per config: before/after/delta lists and the paired difference to the first config, by seed."""
    baseline = {r["seed"]: r["after_pass@1"] for r in runs if r["config"] == configs[0]}
    summary = []
    for config in configs:
        mine = [r for r in runs if r["config"] == config]
        paired = [r["after_pass@1"] - baseline[r["seed"]] for r in mine if r["seed"] in baseline]
        summary.append({"config": config, "runs": len(mine),
                        "before": [r["before_pass@1"] for r in mine], "after": [r["after_pass@1"] for r in mine],
                        "delta": [r["after_pass@1"] - r["before_pass@1"] for r in mine], "vs_first": paired})
    return summary


def print_table(summary, first):
    print(f"| config | runs | pass@1 before | pass@1 after (mean +- std) | after - before | after - {first} "
          f"(paired) | per seed |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['config']} | {s['runs']} | {mean_std(s['before'])} | {mean_std(s['after'])} | "
              f"{mean_std(s['delta'])} | {mean_std(s['vs_first'])} | {' '.join(f'{v:.3f}' for v in s['after'])} |")


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Compare train.py configurations over seeds (held-out pass@1).",
                                     epilog="Any other flag is passed to every train.py run.", allow_abbrev=False)
    parser.add_argument("--preset", default="countdown", choices=sorted(PRESETS))
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--configs", default=None, help="comma-separated subset of the preset's configs")
    parser.add_argument("--output-dir", default="runs/compare")
    args, extra = parser.parse_known_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    configs = list(PRESETS[args.preset]["configs"])
    if args.configs:
        unknown = [c for c in args.configs.split(",") if c not in configs]
        if unknown:
            parser.error(f"--configs: unknown {unknown} for preset {args.preset}; choose from {configs}")
        configs = [c for c in configs if c in args.configs.split(",")]
    if not seeds:
        parser.error("--seeds: need at least one seed")
    parse_args(run_argv(args.preset, configs[0], seeds[0], args.output_dir, extra))  # bad flags: fail now

    runs = []
    for seed in seeds:
        for config in configs:
            argv_run = run_argv(args.preset, config, seed, args.output_dir, extra)
            print(f"\n=== {args.preset} {config} seed {seed}: python train.py {' '.join(argv_run)}", flush=True)
            start = time.time()
            result = train.main(argv_run)
            runs.append({"preset": args.preset, "config": config, "seed": seed,
                         "before_pass@1": result["before"]["pass@1"], "after_pass@1": result["after"]["pass@1"],
                         "after_reward": result["after"]["reward"],
                         "train_pass_rate_last10": round(last_train_pass_rate(result["metrics_path"]) or 0.0, 4),
                         "seconds": round(time.time() - start, 1),
                         "output_dir": os.path.dirname(result["metrics_path"]), "argv": " ".join(argv_run)})
    summary = summarize(runs, configs)
    os.makedirs(args.output_dir, exist_ok=True)
    write_csv(os.path.join(args.output_dir, f"{args.preset}_runs.csv"), runs)
    write_csv(os.path.join(args.output_dir, f"{args.preset}_summary.csv"),
              [{"config": s["config"], "runs": s["runs"],
                **{f"{key}_{stat}": (round(f(s[key]), 4) if len(s[key]) > 1 or stat == "mean" else "")
                   for key in ("before", "after", "delta", "vs_first")
                   for stat, f in (("mean", statistics.mean), ("std", statistics.stdev))}} for s in summary])
    print(f"\n{args.preset}: held-out greedy pass@1 over seeds {seeds} ({sum(r['seconds'] for r in runs) / 60:.1f} "
          f"min in total)")
    print_table(summary, configs[0])
    print(f"wrote {args.output_dir}/{args.preset}_runs.csv and {args.preset}_summary.csv")
    return summary


if __name__ == "__main__":
    main()
