"""One command per claim: rerun a shipped cell of docs/results.md or lab/referees.md from scratch and compare.

    python -m lab.reproduce --list            # every cell: kind, cost, results file, command, where it was shipped
                                              # and whether HEAD reruns it (else the commit it reruns at)
    python -m lab.reproduce default           # per metric "NAME METRIC shipped X now Y", then "reproduced: NAME"
                                              # (exit 0) or "differs: NAME" (exit 1)
    python -m lab.reproduce smoke-avx2 --ship # rerun at HEAD and write the result as the shipped one (a maintainer)

A cell is one run or computation with its seed (CELLS; rerun says what each kind measures). Its shipped numbers are
rows under lab/results/ (lab/ledger.py) naming the commit, date, load, machine and command; each CPU kind keeps its
own. A rerun starts from nothing, at HEAD unless a change of the step's numerics (lab/numerics.csv) lies between
the row's commit and HEAD (then in a git worktree of that commit; --at-head: HEAD anyway). It compares with the
rows of its code path (CPU model and ISA: docs/results.md, "Determinism"), pinning this CPU onto a narrower path
where it can, else with another CPU's rows, naming what differs. Tolerance: 0 but for a timing cell's ratios.
"""
import argparse
import csv
import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

from experiments.runs import git
from lab.ledger import (FIELDS, ISA_ORDER, can_run, code_path, cpu_kind, ledger_rows, load_average,  # noqa: F401
                        pin_for, pins, provenance, taking_turns, this_machine, write_results)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "lab", "results")
SMOKE = ["--steps", "4", "--warm-start-steps", "60", "--eval-size", "20", "--prompts-per-step", "4",
         "--eval-every", "2", "--threads", "1"]  # a cheap deterministic run (~1 CPU-minute) for the slow test
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}  # torch's and MKL's AVX2 code path (x86)
ONE = {"OMP_NUM_THREADS": "1"}
STEPLESS = ("identity", "fig1", "eq4", "timing")  # kinds whose numbers no change of the step's numerics moves
# kinds that import none of the step's code (their own update): a numerics change moves them
# only where it touched these files
OWN_CODE = {"imagenet-toy": ("experiments/imagenet_toy.py", "tasks/imagenet_toy.py",
                             "softmax_grpo.py")}
LOPTI_BATCHES = ["--seeds", "0,1,2", "--num-prompts", "64"]  # referee_lopti's 3 batches (its lab/referees.md rows)
TUNING_CONFIGS = [config for M in (8, 4, 16) for config in [f"grpo-M{M}", *(f"softmax-M{M}-tau{tau}" for tau in
                                                                            (0.1, 0.05, 0.3, 1.0))]]  # compare's grid
TABLE3_STEPS = {("countdown3-tuning", "grpo-M8"), ("countdown3-tuning", "softmax-M8-tau0.1")}  # referee_table3's
LOPTI_CLIP = ["--clip-low", "0.2", "--clip-high", "0.24", "--dual-clip", "10"]  # the Lopti recipes' clip
TASK = {"countdown3": ["--task-option", "num_count=3"]}  # referee_lopti's flags for a preset's held-out prompts
# a timing cell's metric <a>_over_<b> agrees within this fraction of the shipped value, by b: trl and one_pass, two
# sides timed alternately in one process (a load slows both); floor, whose peaks one probe before the steps measured
TIMING_TOLERANCE = {"trl": 0.2, "one_pass": 0.2, "floor": 0.4}

# name -> (kind, arguments, results file, minutes on this 2-core CPU when quiet, environment). A cell without AVX2
# runs the machine's own code path: it reproduces on a CPU of the same vector ISA as the row's machine.
CELLS = {
    "default": ("train", [], "default.csv", 3, {}),
    "default-avx2": ("train", [], "default.csv", 3, AVX2),
    "default-avx2-onednn": ("train", [], "default.csv", 3, {**AVX2, "ONEDNN_MAX_CPU_ISA": "AVX2"}),
    # MKL honours this branch on Intel CPUs only; COMPATIBLE with AVX2 kernels: the pin both vendors take
    "default-mkl-avx512": ("train", [], "default.csv", 3, {"MKL_CBWR": "AVX512"}),
    "default-portable": ("train", [], "default.csv", 4, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}),
    "smoke-avx2": ("train", SMOKE, "default.csv", 1, {**AVX2, **ONE}),
    # issue 52's options on the embedded default (docs/performance.md, "bf16 without masters, the step in backward"):
    # bf16 weights with no fp32 masters; the step in backward (one micro-batch a step, no clip), in fp32 and in bf16
    "default-bf16-sr": ("train", ["--param-dtype", "bf16-sr"], "default.csv", 2, {}),
    "default-step-in-backward": ("train", ["--step-in-backward", "--grad-clip", "0", "--micro-batch", "512"],
                                 "default.csv", 2, {}),
    "default-bf16-sr-step-in-backward": ("train", ["--param-dtype", "bf16-sr", "--step-in-backward", "--grad-clip",
                                                   "0", "--micro-batch", "512"], "default.csv", 2, {}),
    # Table 3 (exact budget) and Lopti's Fig. 1(d) / Fig. 3 on the embedded default's final checkpoint
    "default-figures": ("default-figures", [], "default_figures.csv", 5, ONE),
    # items 5-7 on the pretrained SmolLM2-135M-Instruct (before RL), 3 batches of 8 held-out prompts x 4
    "lopti-smollm2-initial": ("referee-lopti-pretrained",
                              ["--checkpoint", "smollm2", "--task", "text_match", "--data", "DATA", "--num-prompts",
                               "8", "-M", "4", "--max-new-tokens", "32", "--token-samples", "4", "--micro-batch", "8",
                               "--seeds", "0,1,2"], "referee_lopti_smollm2.csv", 30, ONE),
    # the same checkpoint's Fig. 3 under one plain SGD step (lr 0.5), the optimizer the Lopti paper's Fig. 3 assumes
    "default-fig3-sgd": ("default-fig3-sgd", ["--optimizer", "sgd", "--lr", "0.5"], "default_figures.csv", 5, ONE),
    "imagenet-toy": ("imagenet-toy", [], "imagenet_toy.csv", 8, ONE),
    # the same under Adam (lr 3e-4, same schedule) at M = 1024, GRPO included
    "imagenet-toy-adam": ("imagenet-toy", ["--optimizer", "adam", "--group-sizes", "1024"], "imagenet_toy.csv", 3, ONE),
    # a real model learns on a CPU (docs/results.md, "A real model learns on a CPU"): one seed a cell, ~21 min
    **{f"smollm2-cpu-seed{seed}": ("smollm2", [str(seed)], "smollm2_cpu.csv", 21, ONE) for seed in (0, 1)},
    # the same with bf16 weights, no fp32 masters (docs/performance.md), and the step in backward too
    "smollm2-cpu-bf16-sr-seed0": ("smollm2", ["0", "--param-dtype", "bf16-sr"], "smollm2_cpu.csv", 25, ONE),
    "smollm2-cpu-bf16-sr-step-in-backward-seed0": ("smollm2", ["0", "--param-dtype", "bf16-sr", "--step-in-backward",
                                                               "--grad-clip", "0", "--micro-batch", "32"],
                                                   "smollm2_cpu.csv", 25, ONE),
    # docs/performance.md's step-time tables: ours against TRL and each phase against its floor (ratios, tolerance)
    "step-time-tiny-cpu": ("timing", ["--no-memory"], "performance_step.csv", 3, ONE),
    "step-time-smollm2-cpu": ("timing", ["--preset", "smollm2-cpu", "--steps", "2", "--warmup", "1", "--no-memory",
                                         "--threads", "1"], "performance_step.csv", 8, ONE),
    # docs/performance.md's log-prob fidelity (bf16, its heads, vs fp64) on SmolLM2: no seconds
    "logprob-fidelity-smollm2-cpu": ("fidelity", ["--threads", "2", "--prompts", "2", "-M", "2",
                                                  "--max-new-tokens", "16"],
                                     "logprob_fidelity.csv", 3, {}),
    "table3-identity": ("identity", ["16", "0.1"], "table3_identity.csv", 0, {}),
    "eq4-monte-carlo": ("eq4", [], "eq4_monte_carlo.csv", 1, ONE),
    "fig1-prompt-weight": ("fig1", ["8", "0.1"], "fig1_prompt_weight.csv", 0, {}),
    # item 5's clipped case on countdown3's GRPO seed 0 (issue 38): 3 batches of 64 held-out prompts x 8
    "lopti-offpolicy-seed0": ("referee-lopti", ["countdown3", "grpo", "0", LOPTI_BATCHES,
                                                {"run_clip": [], "lopti_clip": LOPTI_CLIP}],
                              "referee_lopti_offpolicy.csv", 8, ONE),
    # items 5-6 before RL: the same run's warm start (referee_lopti --initial), on-policy and off-policy
    "lopti-initial-seed0": ("referee-lopti", ["countdown3", "grpo", "0", LOPTI_BATCHES, {"initial": ["--initial"]}],
                            "referee_lopti_offpolicy.csv", 8, ONE),
    **{f"countdown3{pin}-{config}-seed{seed}": ("compare", ["countdown3", config, str(seed)], "countdown3_runs.csv",
                                               5, {**env, **ONE})
       for pin, env in (("", {}), ("-avx2", AVX2)) for seed in range(20) for config in ("grpo", "softmax")},
    # the referees' tuning grid (lab.referee_tuning): 15 cells x seeds 0-2, one run each
    **{f"countdown3-tuning-{config}-seed{seed}": ("compare", ["countdown3-tuning", config, str(seed)],
                                                  "referee_tuning_runs.csv", 4, ONE)
       for seed in range(3) for config in TUNING_CONFIGS},
    # the referees' clipping runs (lab.referee_clipping): Eq. (2), the recipe, the recipe with 2 mini-batches
    **{f"countdown3-eq2-{method}-{name}-seed{seed}": ("compare", ["countdown3-eq2", f"{method}-{name}", str(seed)],
                                                     "referee_clipping_runs.csv", 4, ONE)
       for seed in range(3) for method in ("grpo", "softmax") for name in ("eq2", "recipe", "recipe-2mb")},
    # GRPO vs AR vs Lopti vs AR+Lopti on the countdown3 prompts; the grpo cells carry Fig. 3 on their final policy
    **{f"countdown3-lopti-{config}-seed{seed}": ("compare", ["countdown3-lopti", config, str(seed)],
                                                "countdown3_lopti_runs.csv", 4 if config != "grpo" else 6, ONE)
       for seed in range(5) for config in ("grpo", "ar", "lopti", "ar+lopti")},
    # GRPO vs SoftmaxGRPO on train.py's default task (2-number Countdown)
    **{f"countdown-{config}-seed{seed}": ("compare", ["countdown", config, str(seed)], "countdown_runs.csv", 3, ONE)
       for seed in range(3) for config in ("grpo", "softmax")},
}


def shipped_rows(name):
    """Every shipped row of a cell, of every CPU it was shipped from ([] if none)."""
    return [row for row in ledger_rows(os.path.join(RESULTS, CELLS[name][2])) if row["cell"] == name]


def shipped_values(name, machine=None):
    """{metric: value} of a cell's rows of one machine: the first whose machine contains
    `machine`, by default one on the code path a rerun here takes (run_path), this CPU kind's
    first; {} if none (each path has its own trajectories; two machines' are never mixed)."""
    if machine:
        rows = [row for row in shipped_rows(name) if machine in row["machine"]]
        return {row["metric"]: float(row["value"]) for row in rows
                if row["machine"] == rows[0]["machine"]}
    return {metric: float(row["value"]) for metric, row in shipped(name).items()
            if row_path(row) == run_path(name)}


def row_path(row):
    """The code path a shipped row's numbers followed: its machine, and the pin its command set."""
    return code_path(row["machine"], row["command"])


def run_path(name, machine=None, extra=None):
    """The code path a rerun of the cell takes on `machine` (default: this one): the cell's pin, else the one
    `extra` or this process's environment sets, else the machine's own ISA."""
    return code_path(machine or this_machine(), {**pins(os.environ if extra is None else extra), **CELLS[name][4]})


def shipped(name, machine=None, extra=None):
    """{metric: row} of a cell's shipped results on the code path a rerun takes (run_path;
    `machine` default this one), this CPU kind's where it shipped some; where none was shipped on
    that path, another path's rows (the first in the file); {} if none. One machine's rows."""
    rows, path = shipped_rows(name), run_path(name, machine, extra)
    kind = cpu_kind(machine or this_machine())
    on_path = [row for row in rows if row_path(row) == path]
    first = next((row for row in on_path if cpu_kind(row["machine"]) == kind), (on_path or rows or [{}])[0])
    return {row["metric"]: row for row in rows
            if (row["machine"], row["command"]) == (first.get("machine"), first.get("command"))}


@functools.lru_cache(maxsize=None)
def numerics_since(commit, kind="train"):
    """The changes of the step's numerics (lab/numerics.csv: commit, date, change; a row without a commit names the
    one that added it) that HEAD has and `commit`, a row's, has not: [] where HEAD reproduces the row; None where git
    cannot tell. A cell of a STEPLESS kind has none; of an OWN_CODE kind, only those whose commit
    touched its code."""
    if kind in STEPLESS:
        return []
    rows = read_rows(os.path.join(REPO, "lab", "numerics.csv"))
    for line, row in enumerate(rows, 2):
        row["commit"] = row["commit"] or git("blame", "--porcelain", "-L", f"{line},+1", "lab/numerics.csv")[:7]
    rows = [row for row in rows if kind not in OWN_CODE or set(OWN_CODE[kind]) & set(
        git("show", "--name-only", "--format=", row["commit"]).split())]
    head, commit = git("rev-parse", "HEAD"), git("rev-parse", "--verify", "-q", commit.split("-")[0] + "^{commit}")
    return None if not (head and commit) else [row for row in rows if git("merge-base", row["commit"], head) == git(
        "rev-parse", row["commit"]) != git("merge-base", row["commit"], commit)]


def head_reproduces(name, commit):
    """--list's word on whether HEAD reruns a row of the cell made at `commit` (numerics_since)."""
    since = numerics_since(commit, CELLS[name][0])
    return "" if since == [] else ", HEAD: unknown (git cannot tell)" if since is None else (
        f", reruns at {commit} (numerics changed at {', '.join(row['commit'] for row in since)})")


def preset_cells(preset):
    """The cells of an lab.compare preset: <preset>-<config>-seed<N>, one run each."""
    return [name for name, (kind, args, *_) in CELLS.items() if kind == "compare" and args[0] == preset]


def none_shipped(tool, what, names, machine=None, option="--machine"):
    """The one line a reader of the shipped rows of cells `names` stops with where `machine` (default: this CPU's
    code path) shipped none: which CPUs did."""
    paths = sorted({row_path(row) for name in names for row in shipped_rows(name)})
    return SystemExit(f"{tool}: error: no {what} was shipped from " + (f"a CPU named {machine!r}" if machine else
                      f"this CPU ({code_path(this_machine(), os.environ)})") + (
                      f"; from {' and '.join(paths)} ({option} NAME reads one)" if paths else "; from no CPU"))


def what_differs(path, other):
    """Which part of two code paths ("CPU model, ISA") differs: the vendor, the CPU model, the instruction set."""
    (model, isa), (model2, isa2) = path.rsplit(", ", 1), other.rsplit(", ", 1)
    parts = (["vendor" if model.split()[0] != model2.split()[0] else "CPU model"] if model != model2 else []) + (
        ["instruction set"] if isa != isa2 else [])
    return "another " + " and ".join(parts)


def choose_pin(name):
    """The pin (ATEN_CPU_CAPABILITY, MKL_CBWR) that puts this CPU on a path whose rows exist where it can (can_run);
    {} where its own path has rows, a pin is set already, or it can take none."""
    rows = shipped_rows(name)
    if not rows or pins(os.environ) or pins(CELLS[name][4]) or any(row_path(row) == run_path(name) for row in rows):
        return {}
    runnable = sorted({row_path(row) for row in rows if can_run(this_machine(), row_path(row))},
                      key=lambda path: ISA_ORDER.index(path.rpartition(", ")[2]))  # the widest ISA first
    return pin_for(runnable[-1]) if runnable else {}


def command_text(name, extra=None):
    """The cell's command as a shell line, its environment (and `extra`'s variables, a pin) first."""
    kind, args, _, _, env = CELLS[name]
    prefix = "".join(f"{key}={value} " for key, value in {**(extra or {}), **env}.items())
    if kind == "train":
        return prefix + "python train.py " + " ".join(args)
    if kind == "compare":
        command = prefix + f"python -m lab.compare --preset {args[0]} --configs {args[1]} --seeds {args[2]}"
        return command + ("; " + prefix + f"python -m lab.referee_table3 --seeds {args[2]} (metrics "
                          "table3_step<N>_*)" if (args[0], args[1]) in TABLE3_STEPS else "")
    if kind == "eq4":
        return prefix + "python -m experiments.eq4_monte_carlo"
    if kind == "timing":
        return prefix + "python benchmarks/step_time.py " + " ".join(args)
    if kind == "imagenet-toy":
        return prefix + " ".join(["python -m experiments.imagenet_toy", *args])
    if kind == "smollm2":
        return prefix + " ".join(["python -m experiments.smollm2_cpu --seeds", *args])
    if kind == "referee-lopti-pretrained":
        return (f"experiments.smollm2_cpu.write_data(DATA); {prefix}python -m lab.referee_lopti "
                + " ".join(args))
    if kind == "default-fig3-sgd":
        return (f"{prefix}python train.py --output-dir RUN; {prefix}python -m experiments.lopti_token_stats "
                f"--checkpoint RUN/latest {' '.join(args)}")
    if kind == "default-figures":
        return (f"{prefix}python train.py --output-dir RUN; {prefix}python -m experiments.table3_allocation "
                f"--checkpoint RUN/latest -M 16 --exact; {prefix}python -m experiments.lopti_token_stats "
                "--checkpoint RUN/latest")
    if kind == "fidelity":
        return prefix + " ".join(["python benchmarks/logprob_fidelity.py", *args, "--ship", name])
    if kind == "fig1":
        return f"experiments.fig1_prompt_weight.prompt_weight_curves(p = 0, 0.5, 1; M={args[0]}, taus=[{args[1]}])"
    if kind == "referee-lopti":
        preset, config, seed, batches, variants = args
        checkpoint = f"RUNS/{preset}/{config}-seed{seed}/latest"
        measure = " ".join([f"{prefix}python -m lab.referee_lopti --checkpoint {checkpoint}", *TASK[preset], *batches])
        return "; ".join([prefix + f"python -m lab.compare --preset {preset} --configs {config} --seeds "
                          f"{seed} --output-dir RUNS", measure + " (metrics " + "; ".join(
                              f"{name}_*" + (f": the same with {' '.join(flags)}" if flags else "")
                              for name, flags in variants.items()) + ")"])
    return f"experiments.table3_allocation.identity_table(M={args[0]}, tau={args[1]})"


PROGRESS = {}  # main's cell: its name, start time and expected minutes, for run_quietly's progress lines
PROGRESS_EVERY = 30  # seconds between two progress lines


def run_quietly(argv, environment):
    """A fresh process of the project's code at PROGRESS["code"] (default this checkout; a module lab.X that code
    lacks is its experiments.X, where the lab lived until ebc7f6b); its progress bars are swallowed (a line on stderr
    every PROGRESS_EVERY seconds says how long the cell has run), and a failure shows the end of its stderr."""
    code = PROGRESS.get("code", REPO)
    if argv[1] == "-m" and argv[2].startswith("lab.") and not os.path.isfile(os.path.join(code, *argv[2].split(".")) +
                                                                              ".py"):
        argv = [*argv[:2], "experiments." + argv[2][4:], *argv[3:]]
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(argv, cwd=code, env=environment, stdout=subprocess.DEVNULL, stderr=errors, text=True)
        while True:
            try:
                proc.wait(timeout=PROGRESS_EVERY)
                break
            except subprocess.TimeoutExpired:
                if PROGRESS:
                    elapsed = int(time.time() - PROGRESS["start"])
                    print(f"reproduce: {PROGRESS['name']}: running, {elapsed // 60}:{elapsed % 60:02d} so far "
                          f"(~{PROGRESS['minutes']} min on a quiet 2-core CPU)", file=sys.stderr, flush=True)
        if proc.returncode:
            errors.seek(0)
            sys.stderr.write(errors.read()[-4000:])
            raise SystemExit(f"reproduce: error: {' '.join(argv[1:])} exited with {proc.returncode} (its stderr "
                             "above)")


def rerun(name, folder, extra=None):
    """Run the cell from scratch in `folder` (with `extra`'s environment variables, a pin) -> {metric: value}."""
    kind, args, _, _, env = CELLS[name]
    environment = {**os.environ, **(extra or {}), **env}
    if kind == "identity":
        from experiments.table3_allocation import identity_table
        return {f"ratio_k{row['k']}": round(row["ratio"], 6) for row in identity_table(int(args[0]), float(args[1]))}
    if kind == "fig1":  # exact functions of p (Fig. 1's curves), at the ends and the middle
        import numpy as np
        from experiments.fig1_prompt_weight import prompt_weight_curves
        curves = prompt_weight_curves(np.array([0.0, 0.5, 1.0]), int(args[0]), [float(args[1])])
        return {f"{name}_p{p:g}": round(float(value), 6) for name, values in curves.items() if name != "p"
                for p, value in zip((0.0, 0.5, 1.0), values)}
    if kind == "fidelity":  # its --ship into a new results file: the rows it writes
        ship_to = os.path.join(folder, "fidelity.csv")
        run_quietly([sys.executable, "-c", "import sys, benchmarks.logprob_fidelity as b; "
                     "b.RESULTS = sys.argv[1]; b.main(sys.argv[2:])", ship_to, *args, "--ship", name],
                    environment)
        return {row["metric"]: float(row["value"]) for row in ledger_rows(ship_to)}
    if kind == "eq4":
        run_quietly([sys.executable, "-m", "experiments.eq4_monte_carlo", "--output-dir", folder], environment)
        return eq4_metrics(read_rows(os.path.join(folder, "eq4_monte_carlo.csv")))
    if kind == "train":
        run_quietly([sys.executable, "train.py", *args, "--output-dir", folder], environment)
        from harness.metrics import read_metrics
        evals = [row for row in read_metrics(os.path.join(folder, "metrics.jsonl")) if row.get("eval")]
        return {"before_pass@1": evals[0]["pass@1"], "after_pass@1": evals[-1]["pass@1"]}
    if kind == "referee-lopti":
        return rerun_referee_lopti(args, folder, environment)
    if kind == "timing":
        return rerun_timing(args, folder, environment)
    if kind == "default-figures":
        return rerun_default_figures(folder, environment)
    if kind == "default-fig3-sgd":
        return rerun_default_figures(folder, environment, lopti_flags=args, table3=False)
    if kind == "referee-lopti-pretrained":
        from experiments.smollm2_cpu import write_data
        data = os.path.join(folder, "data")
        write_data(data)
        out = os.path.join(folder, "referee")
        run_quietly([sys.executable, "-m", "lab.referee_lopti", *[data if a == "DATA" else a for a in args],
                     "--output-dir", out], environment)
        return onpolicy_cell_metrics(out)
    if kind == "smollm2":
        run_quietly([sys.executable, "-m", "experiments.smollm2_cpu", "--seeds", *args, "--output-dir", folder],
                    environment)
        return {f"{key}_step{row['step']}": round(float(row[key]), 6)
                for row in read_rows(os.path.join(folder, "smollm2_cpu.csv")) for key in ("reward", "pass@1")}
    if kind == "imagenet-toy":
        run_quietly([sys.executable, "-m", "experiments.imagenet_toy", *args, "--output-dir", folder], environment)
        return {f"{row['method']}{'_M' + row['M'] if row['M'] else ''}_{key}": round(float(row[key]), 6)
                for row in read_rows(os.path.join(folder, "final.csv")) for key in ("top1", "pass@1", "pass@128")}
    preset, config, seed = args
    run_quietly([sys.executable, "-m", "lab.compare", "--preset", preset, "--configs", config, "--seeds", seed,
                 "--output-dir", folder], environment)  # countdown3's diagnostics: Table 3 on the final policy
    if (preset, config) in TABLE3_STEPS:  # the referees' Table 3 at steps 50, 100, 150 of this run's checkpoints
        run_quietly([sys.executable, "-m", "lab.referee_table3", "--seeds", seed, "--output-dir", folder],
                    environment)
    return compare_metrics(folder, preset)


def rerun_timing(args, folder, environment):
    """The timing kind: benchmarks/step_time.py with `args`, its tiny model's warm start made afresh in `folder`
    -> timing_metrics of the numbers it wrote; says so where TRL did not run (its ratios are then missing)."""
    path = os.path.join(folder, "step_time.json")
    run_quietly([sys.executable, os.path.join("benchmarks", "step_time.py"), *args, "--json", path,
                 "--warm-start-cache", folder], environment)
    with open(path) as f:
        numbers = json.load(f)
    if numbers["trl_skipped"]:
        print(f"note: TRL's side did not run ({numbers['trl_skipped']}): no one_pass_over_trl, trl_step_over_floor")
    return timing_metrics(numbers)


def timing_metrics(numbers):
    """A timing cell's metrics from step_time.py's step_numbers: its quoted ratios (one_pass_over_trl,
    lopti_over_one_pass, <side>_step_over_floor, trl_step_over_floor) and each of our sides' phases (not their parts)
    over its floor, <side>_<phase>_over_floor; rounded to 3 digits. Ratios only: seconds depend on the machine."""
    metrics = {f"{side}_{re.sub('[^a-z0-9]+', '_', phase)}_over_floor": row["ratio"]
               for side, numbers_of_side in numbers["sides"].items() for phase, row in
               numbers_of_side.get("phases", {}).items() if not row["part"] and row["ratio"] is not None}
    return {metric: round(value, 3) for metric, value in sorted({**metrics, **numbers["ratios"]}.items())}


def tolerance(name, metric):
    """The relative tolerance of a cell's metric: 0 (equal) but for a timing cell's ratios (TIMING_TOLERANCE)."""
    return TIMING_TOLERANCE[metric.rsplit("_over_", 1)[1]] if CELLS[name][0] == "timing" else 0.0


def agrees(shipped_value, value, relative_tolerance):
    """Whether a rerun's value agrees with the shipped one: within relative_tolerance of it (0: equal)."""
    return abs(value - shipped_value) <= relative_tolerance * abs(shipped_value)


def eq4_metrics(rows):
    """The Eq. (4) table's numbers from eq4_monte_carlo.csv rows: per (M, tau) the largest |z|, the intervals
    (mean +- 1.96 SE) holding the exact omega, and the Monte-Carlo mean at p = 0.1, 0.5, 0.9 (rounded to 6 digits)."""
    metrics = {}
    for key in dict.fromkeys((row["M"], row["tau"]) for row in rows):
        mine = [row for row in rows if (row["M"], row["tau"]) == key]
        name = f"M{key[0]}_tau{key[1]}"
        metrics[f"{name}_max_abs_z"] = round(max(abs(float(row["z"])) for row in mine), 6)
        metrics[f"{name}_intervals_holding"] = float(sum(abs(float(row["z"])) <= 1.96 for row in mine))
        for row in mine:
            if round(float(row["p"]), 6) in (0.1, 0.5, 0.9):
                metrics[f"{name}_mc_mean_p{round(float(row['p']), 1)}"] = round(float(row["mc_mean"]), 6)
    return metrics


def compare_metrics(folder, preset, config=None, seed=None):
    """One run of an lab.compare folder (the first, or config/seed's): pass@k (<preset>_runs.csv), and where measured
    Table 3 (per bin its prompts and budget shares under both advantages) on the final policy or at steps
    (table3_step<N>_*), Fig. 3 (a grpo run) and the clip's activity (countdown3-eq2)."""
    def mine(path):
        rows = [row for row in read_rows(path) if config is None or (row["config"], row["seed"]) == (config, str(seed))]
        return [row for row in rows if (row["config"], row["seed"]) == (rows[0]["config"], rows[0]["seed"])]
    run = mine(os.path.join(folder, f"{preset}_runs.csv"))[0]
    metrics = {key: float(value) for key, value in run.items() if "pass@" in key and value != ""}
    if preset == "countdown3-eq2":  # the clip's and the KL's activity over training (lab.referee_clipping)
        metrics.update(clip_activity(run["output_dir"]))
    fig3 = os.path.join(folder, f"{preset}_fig3", "fig3_prob_rise.csv")
    if run["config"] == "grpo" and os.path.isfile(fig3):  # Lopti's Fig. 3 on this seed's final GRPO policy
        metrics.update({f"fig3_{row['method']}_Q{row['group']}_{key}": round(float(row[key]), 6)
                        for row in read_rows(fig3) if row["seed"] == run["seed"]
                        for key in ("pos_rose_share", "neg_fell_share") if row[key] not in ("", "nan")})
    for suffix in ("table3", "table3_steps"):
        path = os.path.join(folder, f"{preset}_{suffix}.csv")
        for row in mine(path) if os.path.isfile(path) else []:
            name = f"table3_step{row['step']}" if "step" in row else "table3"
            metrics.update({f"{name}_prompts_{row['bin']}": float(row["prompts"]),
                            f"{name}_share_grpo_adv_{row['bin']}": float(row["share_grpo_advantages"]),
                            f"{name}_share_softmax_adv_{row['bin']}": float(row["share_softmax_advantages"])})
    return metrics


def clip_activity(run_dir):
    """One run's metrics.jsonl (lab.ledger.activity): the clipped token fractions' means over steps, the largest
    ratio, the k3 KL at steps 50 and the last, and whether every ratio was exactly 1 (1.0 or 0.0)."""
    from lab.ledger import activity, ratio_is_one
    series = activity(os.path.join(run_dir, "metrics.jsonl"))
    kl = dict(series["kl"])
    metrics = {f"{key}_mean": round(sum(v for _, v in series[key]) / len(series[key]), 8)
               for key in ("clip_frac_low", "clip_frac_high") if series[key]}
    if series["ratio_max"]:
        metrics.update(ratio_max=max(v for _, v in series["ratio_max"]), ratio_exactly_one=float(ratio_is_one(series)))
    for step in (50, max(kl)) if kl else ():
        if step in kl:
            metrics[f"kl_step{step}"] = kl[step]
    return metrics


def read_referee_rows(path):
    """A referee_lopti CSV's rows, every value a float but adamw_moments'."""
    return [{key: value if key == "adamw_moments" else float(value) for key, value in row.items()}
            for row in read_rows(path)]


def onpolicy_cell_metrics(out):
    """The on-policy numbers of a referee_lopti output folder: per-quartile metrics and the quartiles' cosines."""
    from lab.referee_lopti import cosine_metrics, onpolicy_metrics
    return {**onpolicy_metrics(read_referee_rows(os.path.join(out, "referee_lopti.csv"))),
            **cosine_metrics(read_referee_rows(os.path.join(out, "referee_lopti_cosines.csv")))}


def rerun_referee_lopti(args, folder, environment):
    """The referee-lopti kind: train the compare run, then measure each clip setting -> {metric: value}."""
    preset, config, seed, batches, variants = args
    run_quietly([sys.executable, "-m", "lab.compare", "--preset", preset, "--configs", config, "--seeds", seed,
                 "--output-dir", folder, "--no-diagnostics"], environment)
    checkpoint = os.path.join(folder, preset, f"{config}-seed{seed}", "latest")
    from lab.referee_lopti_offpolicy import OFFPOLICY_KEYS, offpolicy_metrics

    metrics = {}
    for name, flags in variants.items():
        out = os.path.join(folder, f"referee-{name}")
        run_quietly([sys.executable, "-m", "lab.referee_lopti", "--checkpoint", checkpoint,
                     *TASK[preset], *batches, *flags, "--output-dir", out], environment)
        first = len(metrics) == 0
        if first:  # the on-policy part and the off-policy state do not depend on the clip: their numbers once
            metrics.update(onpolicy_cell_metrics(out))
        metrics.update(offpolicy_metrics(read_referee_rows(os.path.join(out, "referee_lopti_offpolicy.csv")), prefix=f"{name}_",
                                         keys=OFFPOLICY_KEYS if first else OFFPOLICY_KEYS[2:], weights=first))
    return metrics


def rerun_default_figures(folder, environment, lopti_flags=(), table3=True):
    """`python train.py`, then Table 3 (-M 16 --exact; table3=False: not) and Lopti's Fig. 1(d) / Fig. 3 (extra
    lopti_token_stats flags: lopti_flags) on its final checkpoint -> {metric: value}."""
    run = os.path.join(folder, "default")
    run_quietly([sys.executable, "train.py", "--output-dir", run], environment)
    checkpoint = os.path.join(run, "latest")
    if table3:
        run_quietly([sys.executable, "-m", "experiments.table3_allocation", "--checkpoint", checkpoint, "-M", "16",
                     "--exact", "--output-dir", os.path.join(folder, "table3")], environment)
    run_quietly([sys.executable, "-m", "experiments.lopti_token_stats", "--checkpoint", checkpoint, *lopti_flags,
                 "--output-dir", os.path.join(folder, "lopti")], environment)
    metrics = {}
    for row in read_rows(os.path.join(folder, "table3", "table3_allocation.csv")) if table3 else ():
        metrics[f"table3_prompts_{row['bin']}"] = float(row["prompts"])
        metrics[f"table3_{row['method']}_{row['budget']}_{row['bin']}"] = round(float(row["share"]), 6)
    for row in read_rows(os.path.join(folder, "lopti", "fig1d_grad_norm.csv")):
        metrics[f"fig1d_Q{row['group']}_share"] = round(float(row["share_of_sum"]), 6)
    for row in read_rows(os.path.join(folder, "lopti", "fig3_prob_rise.csv")):
        if row["pos_rose_share"] not in ("", "nan"):  # nan: no A > 0 token in that quartile
            metrics[f"fig3_{row['method']}_Q{row['group']}_pos_rose"] = round(float(row["pos_rose_share"]), 6)
    return metrics


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def ship(name, values, made=None, extra=None):
    """Write a cell's values as its shipped rows of this CPU kind and code path (replacing those
    only: another CPU kind's rows stay, on any path) in its results file. extra: the pin the run
    set beyond the cell's own (the environment's by default): part of the command."""
    path = os.path.join(RESULTS, CELLS[name][2])
    made = {**(made or provenance()), "command": command_text(name, pins(os.environ) if extra is None else extra)}
    with taking_turns(RESULTS):  # another ship's read-and-write of the file is not interleaved with this one's
        mine = (name, cpu_kind(made["machine"]), row_path(made))  # another CPU's or path's stay
        rows = [row for row in ledger_rows(path)
                if (row["cell"], cpu_kind(row["machine"]), row_path(row)) != mine]
        rows += [{"cell": name, "metric": metric, "value": value, **made} for metric, value in values.items()]
        write_results(path, sorted(rows, key=lambda row: (row["cell"], row["machine"], row["metric"])))


def ship_from(folder, load, preset=None):
    """Ship each finished run of one preset (`preset`: where the folder holds several) of an lab.compare folder, run
    here with its cells' environment, as its cell <preset>-<config>-seed<N>: the commit from its code.json (none:
    refused), the date its metrics were last written, this machine, `load` as given. -> the cells shipped."""
    from experiments.runs import CODE_FILE, recorded_code
    presets = sorted(name[:-len("_runs.csv")] for name in os.listdir(folder) if name.endswith("_runs.csv"))
    if preset is None and len(presets) != 1:
        raise SystemExit(f"reproduce: error: {folder} holds the runs of {len(presets)} presets "
                         f"({', '.join(presets) or 'none'}); name one with --preset")
    preset = preset or presets[0]
    if preset not in presets:
        raise SystemExit(f"reproduce: error: {folder} has no {preset}_runs.csv")
    runs, names = read_rows(os.path.join(folder, f"{preset}_runs.csv")), []
    for run in runs:
        name = f"{preset}-{run['config']}-seed{run['seed']}"
        if name not in CELLS:
            raise SystemExit(f"reproduce: error: {name} (from {folder}) is not a cell")
        commit = recorded_code(run["output_dir"])
        if commit == "unknown":
            raise SystemExit(f"reproduce: error: {run['output_dir']} has no {CODE_FILE}: which code trained it is "
                             "not known, so it is not shipped")
        if "-dirty" in commit:
            raise SystemExit(f"reproduce: error: {run['output_dir']} was trained by uncommitted code ({commit})")
        finished = os.path.getmtime(os.path.join(run["output_dir"], "metrics.jsonl"))
        ship(name, compare_metrics(folder, preset, run["config"], run["seed"]),
             {"commit": commit[:7], "date": time.strftime("%Y-%m-%d %H:%M UTC (finished)", time.gmtime(finished)),
              "load": load, "machine": this_machine()})
        names.append(name)
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lab.reproduce", description=__doc__.split("\n")[0])
    parser.add_argument("cell", nargs="?", help="the cell to rerun (--list names them)")
    parser.add_argument("--list", action="store_true", help="every cell: shipped or not, its file, cost, command")
    parser.add_argument("--ship", action="store_true", help="write the rerun's values as the cell's shipped ones")
    parser.add_argument("--ship-from", metavar="FOLDER", help="ship every run of an lab.compare output "
                        "folder of one preset (trained here with its cells' environment) as its cells")
    parser.add_argument("--preset", help="with --ship-from: the preset to ship, where the folder holds several")
    parser.add_argument("--load", default="not recorded", help="with --ship-from: the load the runs ran under")
    parser.add_argument("--at-head", action="store_true", help="rerun at HEAD even where the step's numerics "
                        "changed since the row's commit (lab/numerics.csv; by default it reruns at that commit)")
    args = parser.parse_args(argv)
    if args.ship_from:
        for name in ship_from(args.ship_from, args.load, args.preset):
            print(f"shipped: {name} -> lab/results/{CELLS[name][2]}")
        return 0
    if args.list or not args.cell:
        for name, (kind, _, file, minutes, _) in CELLS.items():
            made = {(row_path(row), cpu_kind(row["machine"])): row for row in shipped_rows(name)}
            mine = (run_path(name), cpu_kind(this_machine()))
            state = "; ".join(
                f"shipped {row['commit']} {row['date']} on {path}" + (f" by {by}" if by != path else "")
                + (" (this CPU's)" if (path, by) == mine else " (this CPU's path)" if path == mine[0]
                   else " (this CPU, pinned)" if can_run(this_machine(), path) else "")
                + head_reproduces(name, row["commit"]) for (path, by), row in made.items())
            print(f"{name:<30} {kind:<9} ~{minutes:>2} min  lab/results/{file:<22} "
                  f"{command_text(name)}  [{state or 'not shipped'}]")
        return 0
    if args.cell not in CELLS:
        parser.error(f"no cell {args.cell!r}; --list names them")
    pin = choose_pin(args.cell)  # this CPU onto the code path whose rows exist, where it can run it
    extra = {**pins(os.environ), **pin}
    before = shipped(args.cell, extra=extra)
    if not before and not args.ship:
        parser.error(f"{args.cell}: nothing shipped yet to compare with (--ship writes it)")
    made, path = next(iter(before.values()), None), run_path(args.cell, extra=extra)
    if pin:
        print(f"note: {args.cell} has no rows of this CPU's own code path ({run_path(args.cell, extra={})}); this "
              f"rerun takes {path} ({' '.join(f'{k}={v}' for k, v in pin.items())}), whose rows {made['machine']} "
              "shipped")
    elif made and row_path(made) != path:
        print(f"note: {args.cell} was never shipped on this CPU's code path ({path}) nor on one it can take; "
              f"comparing with {made['machine']}'s rows ({row_path(made)}): {what_differs(path, row_path(made))} "
              "sums in another order (docs/results.md, 'Determinism'); expect them to differ")
    since = numerics_since(made["commit"], CELLS[args.cell][0]) if made and not args.ship else []
    if since:
        print(f"note: the step's numerics changed since {made['commit']}, which made these rows (lab/numerics.csv: "
              + "; ".join(f"{row['commit']}, {row['change'].split(':')[0]}" for row in since)
              + (f"); rerunning at HEAD as asked: expect them to differ" if args.at_head else
                 f"); rerunning at {made['commit']} (a git worktree; --at-head reruns HEAD)"))
    print(f"reproduce: {args.cell}: rerunning from scratch (~{CELLS[args.cell][3]} min on a quiet 2-core CPU)",
          file=sys.stderr, flush=True)
    PROGRESS.update(name=args.cell, start=time.time(), minutes=CELLS[args.cell][3])
    load_at_start = load_average()  # what else ran when it started: a timing depends on it
    code = provenance()["commit"]  # the code that runs: a commit made while it runs is not what made the numbers
    with tempfile.TemporaryDirectory(prefix=f"reproduce-{args.cell}-") as folder:
        try:
            if since and not args.at_head:  # a git worktree of the row's commit, removed after
                PROGRESS["code"] = os.path.join(folder, "code")
                git("worktree", "add", "--detach", PROGRESS["code"], made["commit"].split("-")[0])
                if not os.path.isfile(os.path.join(PROGRESS["code"], "train.py")):
                    raise SystemExit(f"reproduce: error: git worktree add of {made['commit']} failed")
            now = rerun(args.cell, folder, extra)
        finally:
            if "code" in PROGRESS:
                git("worktree", "remove", "--force", PROGRESS.pop("code"))
    differences = []
    for metric in sorted(set(before) | set(now)):
        old = before.get(metric, {}).get("value", "none")
        new = now.get(metric, "none")
        if old == "none":  # measured now, never shipped for this cell: shown, not compared
            print(f"{args.cell} {metric} shipped none now {new} (not compared)")
            continue
        relative = tolerance(args.cell, metric)
        agreed = new != "none" and agrees(float(old), float(new), relative)
        if not agreed:
            differences.append((abs(float(new) - float(old)) if new != "none" else math.inf, metric))
        print(f"{args.cell} {metric} shipped {old} now {new}"
              + (f" (tolerance ±{relative:.0%}: {'within' if agreed else 'outside'})" if relative else "")
              + (f" difference {float(new) - float(old):+.6g}" if not agreed and new != "none" else ""))
    if args.ship:
        ship(args.cell, now, {**provenance(f"{load_at_start} at start, {load_average()} at end"), "commit": code},
             extra)
        print(f"shipped: {args.cell} -> lab/results/{CELLS[args.cell][2]}")
        return 0
    if differences:
        largest, metric = max(differences)
        print(f"{len(differences)} of {len(before)} numbers differ; the largest difference {largest:.3g} ({metric})")
    print(f"{'differs' if differences else 'reproduced'}: {args.cell}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
