"""Training comparisons over seeds: train.py configurations side by side, held-out greedy pass@1 and pass@k.

    python -m lab.compare                       # countdown3: GRPO vs SoftmaxGRPO, seeds 0-4 (~30 CPU-min)
    python -m lab.compare --preset countdown3-lopti   # GRPO vs AR vs Lopti vs AR+Lopti, then Fig. 3
    python -m lab.compare --preset countdown --seeds 0,1,2   # the easy 2-number default task
    python -m lab.compare --seeds 0,1 --steps 100 --prompts-per-step 32   # extra flags -> train.py

Every run is `train.main([...])` in this process with --task, --seed, --output-dir <output-dir>/<preset>/<config>-
seed<s>, then the preset's shared flags, then the config's flags, then your extra flags (last wins). What is scored
and how seeds are paired (greedy pass@1 before and after, sampled pass@k for k = 1, 2, 4, .. M; --pass-k off skips
it): DESIGN.md §7, "Over seeds".

Presets (PRESETS below: a task, the flags its configs share, each config's flags; the rest is train.py's default):
countdown3 (the default: 3-number Countdown, where the warm start stops at ~5% held-out pass@1 and SoftmaxGRPO's
prompt weight differs most from GRPO's; then Table 3's per-difficulty view on every final policy,
experiments.table3_allocation -M 16; time and numbers: docs/results.md), countdown3-lopti (GRPO, AR, Lopti and
AR+Lopti at the papers' alpha and eta on those prompts; then Lopti's Fig. 3 on each seed's final GRPO policy,
averaged over the seeds, experiments.lopti_token_stats; --no-diagnostics skips it), countdown3-tuning and
countdown3-eq2 (issue 30's fair tuning grid and Eq. (2) runs: lab.referee_tuning, lab.referee_clipping), countdown
(the countdown3 configs on train.py's 2-number task, where nearly every prompt is easy) and kk (Knights-and-Knaves,
the Lopti paper's shared flags, AR/Lopti alone and combined as in DESIGN.md section 1; then Fig. 3).
A run already finished in its folder with the same flags is reused (--rerun trains it again), so a comparison
grows by seeds: `--seeds 0,1,2,3,4,5,6` after `--seeds 0,1,2,3,4` trains only seeds 5 and 6; the tables cover the
seeds given. Runs go one after the other in one process; OMP_NUM_THREADS=1 suits the tiny model.
The tiny model's warm start is cached per (task, seed, warm-start settings) under <output-dir>/warm_start/
(train.py's --warm-start-cache) and linked into every run of that seed, so each seed trains it once; it is
deterministic in the seed, so reusing it changes nothing but the time.
The kk preset with the tiny model is a smoke test of the pipeline, not evidence about AR/Lopti: its warm start
stays near chance (docs/results.md); `--task-option people=3` keeps it short.

The papers' GPU-size flags: recipes/ (extra flags here go to train.py).
Writes <output-dir>/<preset>_runs.csv (one row per run), <output-dir>/<preset>_summary.csv (mean, std, SE, paired
differences with 95% intervals) and <output-dir>/<preset>.png (pass@k vs k per config with SE bars; needs
matplotlib, else skipped with a note).
"""
import argparse
import json
import os
import statistics
import time

import train
from harness.flags import parse_args
from harness.metrics import read_metrics
from experiments import pyplot, save_figure, write_csv
from experiments.runs import finished_run, record_code, seed_list, train_flags
from lab.seed_stats import mean_se, mean_se_interval, mean_std, paired_text, pass_at_k, pass_ks

TUNING_MS, TUNING_TAUS, TUNING_SAMPLES = (8, 4, 16), (0.1, 0.05, 0.3, 1.0), 512  # samples/step = prompts x M


def tuning_configs():
    """The countdown3-tuning grid: GRPO over M, SoftmaxGRPO over M x tau, prompts x M = 512 samples per step in every
    cell (the countdown3 budget). The cells of train.py's countdown3 recipe (M 8, tau 0.1) come first in each seed
    and keep all their checkpoints, for Table 3 at steps 50, 100, 150 (lab.referee_table3)."""
    configs = {}
    for M in TUNING_MS:
        budget = ["-M", str(M), "--prompts-per-step", str(TUNING_SAMPLES // M)]
        keep = ["--keep-checkpoints", "0"] if M == 8 else []
        configs[f"grpo-M{M}"] = ["--method", "grpo", *budget, *keep]
        for tau in TUNING_TAUS:
            configs[f"softmax-M{M}-tau{tau}"] = ["--method", "softmax", "--tau", str(tau), *budget,
                                                 *(keep if tau == 0.1 else [])]
    return configs


# Eq. (2) exactly: one epoch, one mini-batch (on-policy: the ratio is 1), no KL, the clip bounds out of reach;
# the papers' clipped, KL-regularised recipe (SoftmaxGRPO's: one mini-batch, so on-policy too); and it with the
# AR/Lopti runs' 2 mini-batches, whose second optimizer step is off-policy, so that the clip can act
EQ2_CONFIGS = {"eq2": ["--kl-coef", "0", "--ppo-epochs", "1", "--mini-batches", "1", "--clip-low", "0.999",
                       "--clip-high", "1000"],
               "recipe": ["--kl-coef", "1e-3"], "recipe-2mb": ["--kl-coef", "1e-3", "--mini-batches", "2"]}


COUNTDOWN3 = ["--task-option", "num_count=3", "--warm-start-target", "0.05", "--steps", "150"]  # hard prompts
GRPO_SOFTMAX = {"grpo": ["--method", "grpo"], "softmax": ["--method", "softmax", "--tau", "0.1"]}
AR_LOPTI = {"grpo": [], "ar": ["--alpha", "0.2"], "lopti": ["--lopti-eta", "0.4"],  # the papers' alpha and eta
            "ar+lopti": ["--alpha", "0.3", "--lopti-eta", "0.5"]}
PRESETS = {  # the module's docstring says what each is for
    "countdown": dict(task="countdown", shared=[], configs=GRPO_SOFTMAX),
    "countdown3": dict(task="countdown", shared=COUNTDOWN3, configs=GRPO_SOFTMAX, table3=True),
    "countdown3-lopti": dict(task="countdown", shared=[*COUNTDOWN3, "--method", "grpo"], configs=AR_LOPTI, fig3=True),
    "countdown3-tuning": dict(task="countdown", shared=COUNTDOWN3, configs=tuning_configs(), pass_samples=16),
    "countdown3-eq2": dict(task="countdown", shared=COUNTDOWN3, pass_samples=16,
                           configs={f"{method}-{name}": [*method_flags, *flags] for method, method_flags in
                                    GRPO_SOFTMAX.items() for name, flags in EQ2_CONFIGS.items()}),
    "kk": dict(task="knights_knaves",
               shared=["--method", "grpo", "--temperature", "0.7", "--clip-high", "0.24", "--dual-clip", "10"],
               configs=AR_LOPTI, fig3=True),
}
FIG3_PROMPTS = 256  # held-out prompts x M = 8 samples per seed for Fig. 3 (a trained policy leaves few groups mixed)


def run_argv(preset, config, seed, output_dir, extra):
    """The train.py argument list of one run (later flags override earlier ones)."""
    spec = PRESETS[preset]
    run_dir = os.path.join(output_dir, preset, f"{config}-seed{seed}")
    return ["--task", spec["task"], "--seed", str(seed), "--output-dir", run_dir, "--overwrite", *spec["shared"],
            "--warm-start-cache", os.path.join(output_dir, "warm_start"), *spec["configs"][config],
            *extra]  # --overwrite: a comparison run again replaces its own runs


def task_argv(config):
    """The task flags of a run's settings for the diagnostics scripts (experiments.table3_allocation's
    add_checkpoint_arguments): --task, each --task-option, --data."""
    return (["--task", config.task] + [f"--task-option={key}={json.dumps(value)}"
                                       for key, value in config.task_options.items()]
            + (["--data", config.data] if config.data else []))


def fig3_over_seeds(preset, seeds, output_dir, extra):
    """Lopti's Fig. 3 on each seed's final GRPO policy (experiments.lopti_token_stats with that run's task,
    temperature and clip), averaged over the seeds -> the rows of <output_dir>/<preset>_fig3/."""
    from experiments import lopti_token_stats
    config = parse_args(run_argv(preset, "grpo", seeds[0], output_dir, extra))
    argv = ["--checkpoint", os.path.join(output_dir, preset, "grpo-seed{seed}", "latest"), *task_argv(config),
            "--seeds", ",".join(map(str, seeds)), "--num-prompts", str(FIG3_PROMPTS),
            "--temperature", str(config.temperature), "--clip-high", str(config.clip_high),
            "--output-dir", os.path.join(output_dir, f"{preset}_fig3")]
    argv += ["--lr", str(config.lr)] if "lr" in config.given else []  # else train.py's default for the model
    print(f"\n=== {preset}: Lopti Fig. 3 on the final GRPO policies: python -m experiments.lopti_token_stats "
          + " ".join(argv), flush=True)
    try:
        return lopti_token_stats.main(argv)
    except SystemExit:  # its one-line error is printed: a seed whose groups all had equal rewards
        print(f"{preset}: Fig. 3 skipped", flush=True)
        return None


def table3_over_runs(preset, runs, output_dir, extra, M=16, checkpoint="latest", label=None):
    """Table 3's per-difficulty view on every run's final policy (experiments.table3_allocation, -M 16 so that the
    bin [0, .1) holds more than p = 0): the share of the token budget sum |A| len of each pass-rate bin under GRPO's
    and SoftmaxGRPO's advantages, both scoring the same samples. Prints, per trained config, mean +- SE over seeds
    of each share and of the hardest bin's paired difference; writes <output_dir>/<label>.csv (label: default
    <preset>_table3). checkpoint: the run's checkpoint folder to score (e.g. checkpoint-50; default its final)."""
    from experiments import table3_allocation
    label = label or f"{preset}_table3"
    rows = []
    for run in runs:
        config = parse_args(run_argv(preset, run["config"], run["seed"], output_dir, extra))
        argv = ["--checkpoint", os.path.join(run["output_dir"], checkpoint), *task_argv(config), "-M", str(M),
                "--seed", str(run["seed"]), "--temperature", str(config.temperature),
                "--output-dir", os.path.join(output_dir, label, f"{run['config']}-seed{run['seed']}")]
        print(f"\n=== {preset} {run['config']} seed {run['seed']}: Table 3 on {checkpoint}", flush=True)
        try:
            shares = {(r["bin"], r["method"]): r for r in table3_allocation.main(argv) if r["budget"] == "tokens"}
        except SystemExit:  # its one-line error is printed: e.g. every group had equal rewards, nothing to share
            print("Table 3 skipped for this run", flush=True)
            continue
        for name in table3_allocation.BIN_NAMES:
            rows.append({"config": run["config"], "seed": run["seed"], "bin": name,
                         "prompts": shares[(name, "grpo")]["prompts"],
                         "share_grpo_advantages": round(shares[(name, "grpo")]["share"], 4),
                         "share_softmax_advantages": round(shares[(name, "softmax")]["share"], 4)})
    if not rows:
        print(f"\n{preset}: Table 3 skipped: no final policy had a group with unequal rewards")
        return rows
    write_csv(os.path.join(output_dir, f"{label}.csv"), rows)
    print(f"\n{preset}: Table 3 on {checkpoint} of each run, token budget share per pass-rate bin (mean +- SE "
          "over seeds)")
    print("| policy trained with | bin | prompts | share, GRPO advantages | share, SoftmaxGRPO advantages |")
    print("|---|---|---|---|---|")
    for trained in dict.fromkeys(r["config"] for r in rows):
        for name in dict.fromkeys(r["bin"] for r in rows):
            cells = [r for r in rows if r["config"] == trained and r["bin"] == name]
            print(f"| {trained} | {name} | {statistics.fmean(r['prompts'] for r in cells):.0f} | "
                  f"{mean_se([r['share_grpo_advantages'] for r in cells])} | "
                  f"{mean_se([r['share_softmax_advantages'] for r in cells])} |")
        hardest = [r["share_softmax_advantages"] - r["share_grpo_advantages"] for r in rows
                   if r["config"] == trained and r["bin"] == rows[0]["bin"]]
        _, _, interval = mean_se_interval(hardest)
        print(f"hardest bin {rows[0]['bin']}, policies trained with {trained}: SoftmaxGRPO's share - GRPO's "
              f"{mean_se(hardest)}" + (f", 95% interval [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "")
              + " (paired on the same samples)")
    return rows


def last_train_pass_rate(metrics_path, last=10):
    """Mean training-batch pass rate over the last `last` RL steps of a metrics.jsonl (None if no step ran)."""
    rates = [r["pass_rate"] for r in read_metrics(metrics_path) if not r.get("eval")][-last:]
    return sum(rates) / len(rates) if rates else None


def sampled_pass_at_k(run_dir, ks=None, *, seed=0, samples=None):
    """pass@k of a run's final policy (<run_dir>/latest) on its held-out prompts: M = samples (default: the run's
    --num-generations) per prompt at the training temperature and top-p, then the unbiased estimator averaged over
    prompts. -> ({"sampled_pass@k": value for k in ks}, M). ks: default pass_ks(M)."""
    import torch

    import tasks
    from harness.model import load_policy
    from rollout import generate_rollouts, render_prompts
    checkpoint = os.path.join(run_dir, "latest")
    with open(os.path.join(checkpoint, "run.json")) as f:
        saved = json.load(f)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_policy(checkpoint, device=device)
    task = tasks.get_task(saved["task"], data=saved["data"], **saved["task_options"])
    examples = task.examples("test", saved["eval_size"], seed=saved["seed"])  # the held-out prompts train.py scores
    M = samples or saved["num_generations"]
    ks = pass_ks(M) if ks is None else [k for k in ks if k <= M]
    torch.manual_seed(seed)
    rollouts = generate_rollouts(model, tokenizer, render_prompts(tokenizer, task, examples, saved["style"]), M,
                                 max_new_tokens=saved["max_new_tokens"], temperature=saved["temperature"],
                                 top_p=saved["top_p"], rollout_batch=saved["rollout_batch"])
    passes = [0] * len(examples)
    for text, i in zip(rollouts.completions, rollouts.prompt_index.tolist()):
        passes[i] += task.reward(text, examples[i], style=saved["style"]) >= task.pass_threshold
    return {f"sampled_pass@{k}": statistics.mean(pass_at_k(M, c, k) for c in passes) for k in ks}, M


def summarize(runs, configs):
    """Per config: before/after/delta lists and the paired difference to the first config, by seed ("vs_first":
    greedy pass@1); with sampled pass@k, "metrics" maps greedy "after_pass@1" and each "sampled_pass@k" to its
    per-seed values and "paired" to its paired differences to the first config (same seed)."""
    metrics = ["after_pass@1"] + sorted({key for r in runs for key in r if key.startswith("sampled_pass@")},
                                        key=lambda key: int(key.split("@")[1]))  # by k
    baseline = {key: {r["seed"]: r[key] for r in runs if r["config"] == configs[0] and key in r} for key in metrics}
    summary = []
    for config in configs:
        mine = [r for r in runs if r["config"] == config]
        paired = {key: [r[key] - baseline[key][r["seed"]] for r in mine if r["seed"] in baseline[key] and key in r]
                  for key in metrics}
        summary.append({"config": config, "runs": len(mine),
                        "before": [r["before_pass@1"] for r in mine], "after": [r["after_pass@1"] for r in mine],
                        "delta": [r["after_pass@1"] - r["before_pass@1"] for r in mine],
                        "vs_first": paired["after_pass@1"],
                        "metrics": {key: [r[key] for r in mine if key in r] for key in metrics}, "paired": paired})
    return summary


def print_table(summary, first):
    print(f"| config | runs | pass@1 before | pass@1 after (mean +- std) | after - before | after - {first} "
          f"(paired) | per seed |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['config']} | {s['runs']} | {mean_std(s['before'])} | {mean_std(s['after'])} | "
              f"{mean_std(s['delta'])} | {mean_std(s['vs_first'])} | {' '.join(f'{v:.3f}' for v in s['after'])} |")


def metric_label(key):
    return "greedy pass@1" if key == "after_pass@1" else key.replace("sampled_", "")


def print_se_table(summary, first):
    """Mean +- standard error per config, and each config's paired difference to the first with its 95%
    t-interval, for greedy pass@1 and every sampled pass@k."""
    metrics = list(summary[0]["metrics"])
    print("\nmean +- standard error over seeds (sampled pass@k: M samples per held-out prompt at the training "
          "temperature, unbiased estimator)")
    print("| config | runs | " + " | ".join(metric_label(key) for key in metrics) + " |")
    print("|---|---|" + "---|" * len(metrics))
    for s in summary:
        print(f"| {s['config']} | {s['runs']} | " + " | ".join(mean_se(s["metrics"][key]) for key in metrics) + " |")
    for s in summary[1:]:
        print(f"| {s['config']} - {first} (paired, 95% t-interval) | {len(s['paired'][metrics[0]])} | "
              + " | ".join(paired_text(s["paired"][key]) if s["paired"][key] else "" for key in metrics) + " |")


def summary_rows(summary):
    """The summary CSV: the mean/std columns as before, then SE and paired 95% intervals, then sampled pass@k."""
    def number(value):
        return "" if value is None else round(value, 4)
    rows = []
    for s in summary:
        row = {"config": s["config"], "runs": s["runs"],
               **{f"{key}_{stat}": (round(f(s[key]), 4) if len(s[key]) > 1 or stat == "mean" else "")
                  for key in ("before", "after", "delta", "vs_first")
                  for stat, f in (("mean", statistics.mean), ("std", statistics.stdev))}}
        for key in s["metrics"]:
            mean, se, _ = mean_se_interval(s["metrics"][key])
            paired = s["paired"][key]
            p_mean, p_se, interval = mean_se_interval(paired) if paired else (None, None, None)
            row.update({f"{key}_mean": number(mean), f"{key}_se": number(se),
                        f"{key}_vs_first_mean": number(p_mean), f"{key}_vs_first_se": number(p_se),
                        f"{key}_vs_first_ci95_low": number(interval and interval[0]),
                        f"{key}_vs_first_ci95_high": number(interval and interval[1])})
        rows.append(row)
    return rows


def plot(path, summary, title):
    """pass@k vs k per config with SE bars (plus the greedy pass@1 as a separate marker at k = 1). -> written?"""
    plt = pyplot("the PNG; the CSVs have the numbers")
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, s in enumerate(summary):
        color = f"C{i}"
        keys = [key for key in s["metrics"] if key.startswith("sampled_") and s["metrics"][key]]
        if keys:
            ks = [int(key.split("@")[1]) for key in keys]
            stats = [mean_se_interval(s["metrics"][key]) for key in keys]
            ax.errorbar(ks, [m for m, _, _ in stats], yerr=[se or 0.0 for _, se, _ in stats], color=color,
                        marker="o", capsize=3, label=f"{s['config']}: sampled pass@k")
        mean, se, _ = mean_se_interval(s["metrics"]["after_pass@1"])
        ax.errorbar([1], [mean], yerr=[se or 0.0], color=color, marker="s", markerfacecolor="none", linestyle="none",
                    capsize=3, label=f"{s['config']}: greedy pass@1")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("held-out pass@k (mean +- SE over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path, title)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Compare train.py configurations over seeds (held-out pass@1).",
                                     epilog="Any other flag is passed to every train.py run.", allow_abbrev=False)
    parser.add_argument("--preset", default="countdown3", choices=sorted(PRESETS))
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    parser.add_argument("--configs", default=None, help="comma-separated subset of the preset's configs")
    parser.add_argument("--output-dir", default="runs/compare")
    parser.add_argument("--no-diagnostics", dest="diagnostics", action="store_false", help="skip what a preset "
                        "measures on its final policies: Table 3 (countdown3), Lopti's Fig. 3 (countdown3-lopti, kk)")
    parser.add_argument("--rerun", action="store_true", help="train every run again (default: a run already "
                        "finished in its folder with the same flags is reused)")
    parser.add_argument("--pass-k", default="auto",
                        help="after each run, sampled pass@k of the final policy on the held-out prompts (M = "
                             "--num-generations samples per prompt): 'auto' = k = 1, 2, 4, ... M; a comma list; "
                             "'off' = greedy pass@1 only")
    args, extra = parser.parse_known_args(argv)
    extra = train_flags(parser, extra)
    dry_run = "--dry-run" in extra  # each run's settings, then stop
    seeds = seed_list(parser, args.seeds)
    try:
        ks = None if args.pass_k in ("auto", "off") else [int(k) for k in args.pass_k.split(",") if k.strip()]
    except ValueError:
        parser.error(f"--pass-k: expected auto, off or comma-separated integers, got {args.pass_k!r}")
    if ks is not None and (not ks or min(ks) < 1):
        parser.error(f"--pass-k: every k must be >= 1, got {args.pass_k!r}")
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
            if dry_run:
                train.main(argv_run)
                continue
            start = time.time()
            result = None if args.rerun else finished_run(argv_run)
            reused = result is not None
            if reused:
                print(f"reusing the finished run in {os.path.dirname(result['metrics_path'])} (same flags; --rerun "
                      "trains it again)", flush=True)
            else:
                result = train.main(argv_run)
                record_code(os.path.dirname(result["metrics_path"]))  # so that a later reuse can check the code
            run_dir = os.path.dirname(result["metrics_path"])
            row = {"preset": args.preset, "config": config, "seed": seed,
                   "before_pass@1": result["before"]["pass@1"], "after_pass@1": result["after"]["pass@1"],
                   "after_reward": result["after"]["reward"],
                   "train_pass_rate_last10": round(last_train_pass_rate(result["metrics_path"]) or 0.0, 4)}
            if args.pass_k != "off":
                sampled_start = time.time()
                sampled, M = sampled_pass_at_k(run_dir, ks, seed=seed,
                                               samples=PRESETS[args.preset].get("pass_samples"))
                row.update({key: round(value, 4) for key, value in sampled.items()}, samples_per_prompt=M,
                           sampled_seconds=round(time.time() - sampled_start, 1))
                print(f"sampled on the held-out prompts, M={M} per prompt: "
                      + "  ".join(f"{key.replace('sampled_', '')} {value:.3f}" for key, value in sampled.items()),
                      flush=True)
            runs.append({**row, "seconds": round(time.time() - start, 1), "reused": reused, "output_dir": run_dir,
                         "argv": " ".join(argv_run)})
            write_csv(os.path.join(args.output_dir, f"{args.preset}_runs.csv"), runs)  # so far: a stop keeps them
    if dry_run:
        return None
    summary = summarize(runs, configs)
    write_csv(os.path.join(args.output_dir, f"{args.preset}_summary.csv"), summary_rows(summary))
    reused = sum(r["reused"] for r in runs)
    print(f"\n{args.preset}: held-out greedy pass@1 over seeds {seeds} ({sum(r['seconds'] for r in runs) / 60:.1f} "
          f"min in total" + (f"; {reused} finished runs reused" if reused else "") + ")")
    print_table(summary, configs[0])
    print_se_table(summary, configs[0])
    png = os.path.join(args.output_dir, f"{args.preset}.png")
    drew = plot(png, summary, f"{args.preset}: held-out pass@k, seeds {','.join(map(str, seeds))}")
    print(f"wrote {args.output_dir}/{args.preset}_runs.csv and {args.preset}_summary.csv"
          + (f" and {args.preset}.png" if drew else ""))
    if PRESETS[args.preset].get("table3") and args.diagnostics:
        table3_over_runs(args.preset, runs, args.output_dir, extra)
    if PRESETS[args.preset].get("fig3") and "grpo" in configs and args.diagnostics:
        fig3_over_seeds(args.preset, seeds, args.output_dir, extra)
    return summary


if __name__ == "__main__":
    main()
