"""One command per claim: rerun any shipped cell of docs/results.md from scratch at HEAD and compare.

    python -m experiments.reproduce --list            # every cell behind a table or figure: its file, cost, command
    python -m experiments.reproduce default           # rerun one cell; per metric "NAME METRIC shipped X now Y",
                                                      # then "reproduced: NAME" (exit 0) or "differs: NAME" (exit 1)
    python -m experiments.reproduce smoke --ship      # rerun and write the result as the shipped one (a maintainer)

A cell is one run or one computation with its seed. Its shipped numbers live in a small CSV under docs/results/
(one row per metric: cell, metric, value, and the commit, date, load, machine and command that made it); the docs'
tables are typed from those files and the figure scripts read them. A rerun uses a new temporary folder: no earlier
run folder and no cached warm start is reused. Kinds of cell:
  train     `python train.py FLAGS` in a fresh process (ENV set, if the cell has one): held-out greedy pass@1 of the
            starting policy (before) and of the final one (after)
  compare   one run of an experiments.compare preset (`--configs C --seeds S`): greedy pass@1 before/after and the
            sampled pass@k of the final policy
  identity  a formula evaluated by the lesson's own functions (no training): exact
  referee-lopti  a compare run (as above), then `python -m experiments.referee_lopti` on its final checkpoint, once
            per clip setting (FLAGS: the run's own clip; --clip-high 0.24 --dual-clip 10: the Lopti recipes'): item 5's
            off-policy state, per mini-batch and p_old quartile (referee_lopti.offpolicy_metrics), and the on-policy
            mean |w| per quartile and ||G_Q4|| / ||G_Q1|| (onpolicy_metrics)
What the equality rests on: the same code (the commit), torch build, thread count and machine. torch's CPU
kernels and MKL choose their code path by the CPU (AVX-512 or AVX2), and the paths sum in other orders, so another
CPU gives other numbers from the same seed; holding torch, MKL and oneDNN to AVX2 (the -avx2 cells) does not make
two machines agree either (docs/results.md, "Determinism"). Every row records the machine it ran on, and a rerun on
another machine says so before it compares. Tolerance: 0 for every metric here (deterministic cells).
"""
import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "docs", "results")
FIELDS = ("cell", "metric", "value", "commit", "date", "load", "machine", "command")
SMOKE = ["--steps", "4", "--warm-start-steps", "60", "--eval-size", "20", "--prompts-per-step", "4",
         "--eval-every", "2", "--threads", "1"]  # a cheap deterministic run (~1 CPU-minute) for the slow test
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}  # torch's and MKL's AVX2 code path (x86)
ONE = {"OMP_NUM_THREADS": "1"}
LOPTI_BATCHES = ["--seeds", "0,1,2", "--num-prompts", "64"]  # referee_lopti's 3 batches (its docs/results.md rows)
LOPTI_CLIP = ["--clip-low", "0.2", "--clip-high", "0.24", "--dual-clip", "10"]  # the Lopti recipes' clip

# name -> (kind, arguments, results file, minutes on this 2-core CPU when quiet, environment). A cell without AVX2
# runs the machine's own code path: it reproduces on a CPU of the same vector ISA as the row's machine.
CELLS = {
    "default": ("train", [], "default.csv", 3, {}),
    "default-avx2": ("train", [], "default.csv", 3, AVX2),
    "default-avx2-onednn": ("train", [], "default.csv", 3, {**AVX2, "ONEDNN_MAX_CPU_ISA": "AVX2"}),
    "smoke-avx2": ("train", SMOKE, "default.csv", 1, {**AVX2, **ONE}),
    "table3-identity": ("identity", ["16", "0.1"], "table3_identity.csv", 0, {}),
    # item 5's clipped case on countdown3's GRPO seed 0 (issue 38): 3 batches of 64 held-out prompts x 8
    "lopti-offpolicy-seed0": ("referee-lopti", ["countdown3", "grpo", "0", LOPTI_BATCHES,
                                                {"run_clip": [], "lopti_clip": LOPTI_CLIP}],
                              "referee_lopti_offpolicy.csv", 8, ONE),
    **{f"countdown3{pin}-{config}-seed{seed}": ("compare", ["countdown3", config, str(seed)], "countdown3_runs.csv",
                                               5, {**env, **ONE})
       for pin, env in (("", {}), ("-avx2", AVX2)) for seed in range(13) for config in ("grpo", "softmax")},
}


def shipped(name):
    """{metric: row} of a cell's shipped results ({} if none shipped yet)."""
    path = os.path.join(RESULTS, CELLS[name][2])
    if not os.path.isfile(path):
        return {}
    with open(path, newline="") as f:
        return {row["metric"]: row for row in csv.DictReader(f) if row["cell"] == name}


def command_text(name):
    kind, args, _, _, env = CELLS[name]
    prefix = "".join(f"{key}={value} " for key, value in env.items())
    if kind == "train":
        return prefix + "python train.py " + " ".join(args)
    if kind == "compare":
        return prefix + f"python -m experiments.compare --preset {args[0]} --configs {args[1]} --seeds {args[2]}"
    if kind == "referee-lopti":
        preset, config, seed, batches, variants = args
        checkpoint = f"RUNS/{preset}/{config}-seed{seed}/latest"
        measure = " ".join([f"{prefix}python -m experiments.referee_lopti --checkpoint {checkpoint}",
                            *referee_task(preset), *batches])
        return "; ".join([prefix + f"python -m experiments.compare --preset {preset} --configs {config} --seeds "
                          f"{seed} --output-dir RUNS", measure + " (metrics " + "; ".join(
                              f"{name}_*" + (f": the same with {' '.join(flags)}" if flags else "")
                              for name, flags in variants.items()) + ")"])
    return f"experiments.table3_allocation.identity_table(M={args[0]}, tau={args[1]})"


def run_quietly(argv, environment):
    """A fresh process of the project's; its progress bars are swallowed, and a failure shows the end of its stderr
    and stops here."""
    proc = subprocess.run(argv, cwd=REPO, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"reproduce: error: {' '.join(argv[1:])} exited with {proc.returncode} (its stderr above)")


def rerun(name, folder):
    """Run the cell from scratch in `folder` -> {metric: value}."""
    kind, args, _, _, env = CELLS[name]
    environment = {**os.environ, **env}
    if kind == "identity":
        from experiments.table3_allocation import identity_table
        return {f"ratio_k{row['k']}": round(row["ratio"], 6) for row in identity_table(int(args[0]), float(args[1]))}
    if kind == "train":
        run_quietly([sys.executable, "train.py", *args, "--output-dir", folder], environment)
        from harness.metrics import read_metrics
        evals = [row for row in read_metrics(os.path.join(folder, "metrics.jsonl")) if row.get("eval")]
        return {"before_pass@1": evals[0]["pass@1"], "after_pass@1": evals[-1]["pass@1"]}
    if kind == "referee-lopti":
        return rerun_referee_lopti(args, folder, environment)
    preset, config, seed = args
    run_quietly([sys.executable, "-m", "experiments.compare", "--preset", preset, "--configs", config, "--seeds", seed,
                 "--output-dir", folder, "--no-diagnostics"], environment)
    with open(os.path.join(folder, f"{preset}_runs.csv"), newline="") as f:
        row = next(csv.DictReader(f))
    return {key: float(value) for key, value in row.items() if "pass@" in key and value != ""}


def referee_task(preset):
    """The task flags referee_lopti needs to score a preset's checkpoint (its held-out prompts)."""
    return ["--task-option", "num_count=3"] if preset.startswith("countdown3") else []


def rerun_referee_lopti(args, folder, environment):
    """The referee-lopti kind: train the compare run, then measure each clip setting -> {metric: value}."""
    preset, config, seed, batches, variants = args
    run_quietly([sys.executable, "-m", "experiments.compare", "--preset", preset, "--configs", config, "--seeds", seed,
                 "--output-dir", folder, "--no-diagnostics"], environment)
    checkpoint = os.path.join(folder, preset, f"{config}-seed{seed}", "latest")
    from experiments.referee_lopti import OFFPOLICY_KEYS, offpolicy_metrics, onpolicy_metrics

    def read(path):
        with open(path, newline="") as f:
            return [{key: value if key == "adamw_moments" else float(value) for key, value in row.items()}
                    for row in csv.DictReader(f)]

    metrics = {}
    for name, flags in variants.items():
        out = os.path.join(folder, f"referee-{name}")
        run_quietly([sys.executable, "-m", "experiments.referee_lopti", "--checkpoint", checkpoint,
                     *referee_task(preset), *batches, *flags, "--output-dir", out], environment)
        first = len(metrics) == 0
        if first:  # the on-policy part and the off-policy state do not depend on the clip: their numbers once
            metrics.update(onpolicy_metrics(read(os.path.join(out, "referee_lopti.csv"))))
        metrics.update(offpolicy_metrics(read(os.path.join(out, "referee_lopti_offpolicy.csv")), prefix=f"{name}_",
                                         keys=OFFPOLICY_KEYS if first else OFFPOLICY_KEYS[2:], weights=first))
    return metrics


def machine_isa():
    """The vector ISA torch's CPU kernels and MKL pick on this machine: avx512 or avx2 (x86), else the platform."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else platform.machine()


def provenance():
    """The commit (with -dirty for uncommitted changes), date, load and machine of a measurement made now."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no")
                                                   else "")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    isa = machine_isa()
    return {"commit": commit or "unknown", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "",
            "machine": f"{cpu}, {isa}, {os.cpu_count()} cores"}


def ship(name, values, made=None):
    """Write a cell's values as its shipped rows (replacing its old ones) in its results file."""
    path = os.path.join(RESULTS, CELLS[name][2])
    rows = []
    if os.path.isfile(path):
        with open(path, newline="") as f:
            rows = [row for row in csv.DictReader(f) if row["cell"] != name]
    made = made or provenance()
    rows += [{"cell": name, "metric": metric, "value": value, **made, "command": command_text(name)}
             for metric, value in values.items()]
    os.makedirs(RESULTS, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda row: (row["cell"], row["metric"])))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.reproduce", description=__doc__.split("\n")[0])
    parser.add_argument("cell", nargs="?", help="the cell to rerun (--list names them)")
    parser.add_argument("--list", action="store_true", help="every cell: shipped or not, its file, cost, command")
    parser.add_argument("--ship", action="store_true", help="write the rerun's values as the cell's shipped ones")
    args = parser.parse_args(argv)
    if args.list or not args.cell:
        for name, (kind, _, file, minutes, _) in CELLS.items():
            rows = shipped(name)
            made = next(iter(rows.values()), None)
            state = f"shipped {made['commit']} {made['date']}" if made else "not shipped"
            print(f"{name:<26} {kind:<9} ~{minutes:>2} min  docs/results/{file:<22} {state:<36} {command_text(name)}")
        return 0
    if args.cell not in CELLS:
        parser.error(f"no cell {args.cell!r}; --list names them")
    before = shipped(args.cell)
    if not before and not args.ship:
        parser.error(f"{args.cell}: nothing shipped yet to compare with (--ship writes it)")
    made, here = next(iter(before.values()), None), provenance()["machine"]
    if made and made["machine"] != here:
        print(f"note: {args.cell} was shipped from another machine ({made['machine']}; this one: {here}): its "
              "numbers follow the CPU's code path (docs/results.md, 'Determinism'); expect them to differ")
    with tempfile.TemporaryDirectory(prefix=f"reproduce-{args.cell}-") as folder:
        now = rerun(args.cell, folder)
    same = True
    for metric in sorted(set(before) | set(now)):
        old = before.get(metric, {}).get("value", "none")
        new = now.get(metric, "none")
        if old == "none":  # measured now, never shipped for this cell: shown, not compared
            print(f"{args.cell} {metric} shipped none now {new} (not compared)")
            continue
        same &= new != "none" and float(old) == float(new)
        print(f"{args.cell} {metric} shipped {old} now {new}")
    if args.ship:
        ship(args.cell, now)
        print(f"shipped: {args.cell} -> docs/results/{CELLS[args.cell][2]}")
        return 0
    print(f"{'reproduced' if same else 'differs'}: {args.cell}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
