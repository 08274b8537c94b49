"""benchmarks/gpu_check.sh's closing table, read back from its output folder: each check's verdict (the self-checks
the steps ran included: what actually ran), each phase of the step against its floor, and issue 63's targets with
their measured ratios (or "not measured"; a refused fast path's targets "refused", never its plain path's numbers).

    python benchmarks/gpu_summary.py runs/gpu_check          # what gpu_check.sh prints last (summary.txt)
"""
import argparse
import json
import os
import re

# issue 63's targets on one H200 at Qwen2.5-0.5B's shape, 16 prompts x M 8 x 256 tokens: (what, measured / floor or
# ours / TRL, at most)
TARGETS = [("step / its floor", "step", 8.0), ("decode / its floor", "decode", 10.0),
           ("update / its floor", "update", 4.0)]


def read(folder, name):
    path = os.path.join(folder, name)
    return open(path, errors="replace").read() if os.path.isfile(path) else ""


def sections(folder, name):
    """{step name: its output lines} of one of gpu_check.sh's files (a step runs between "=== [N s] NAME: command"
    and "=== NAME: exit ...")."""
    found, current = {}, None
    for line in read(folder, name).splitlines():
        header = re.match(r"^=== \[\d+ s\] (.+?): ", line)
        if header:
            current = header.group(1)
            found[current] = []
        elif line.startswith("=== "):
            current = None
        elif current is not None:
            found[current].append(line)
    return found


def verdicts(folder):
    """[(check, verdict)] from check.txt: the probe, every self-check line, the tiny default's table; then each step's
    own fast-path self-check line (step.txt, more.txt: what its rollout ran)."""
    text, rows = read(folder, "check.txt"), []
    for line in text.splitlines():
        if line.startswith("probe:"):
            rows.append(("peaks", line[len("probe: "):]))
        elif re.match(r"^\S+, (bf16|fp32), .*: (match|REFUSED)", line):
            name, verdict = line.rsplit(": ", 1)
            rows.append(("self-check " + name, verdict))
    before = re.search(r"^before RL(?: \([^)]*\))?\s+(\d\.\d+)", text, re.M)
    after = re.search(r"^after RL \(step (\d+)\)\s+(\d\.\d+)", text, re.M)
    wall = re.search(r"=== tiny default: exit (\d+) after (\d+) s", text)
    if wall:
        rows.append(("tiny default (python train.py)", f"exit {wall.group(1)}, {wall.group(2)} s wall" +
                     (f", held-out pass@1 {before.group(1)} -> {after.group(2)} at step {after.group(1)}"
                      if before and after else "")))
    for name in ("step.txt", "more.txt"):
        for step, lines in sections(folder, name).items():
            for line in lines:
                if line.startswith("fast-path self-check"):
                    rows.append((f"fast path in '{step}'", line.split("): ", 1)[-1]))
    return rows


def table_ratios(lines):
    """{row: ratio} of a floor table as random_model_step.py prints it ("step", "decode", ...)."""
    ratios = {}
    for line in lines:
        row = re.match(r"^\s*(step|rollout|decode|prefill|update|forward\+backward)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)",
                       line)
        if row:
            ratios[row.group(1)] = float(row.group(4))
    return ratios


def fast_generate_step(folder):
    """(ran, {row: ratio}) of part 1's --fast-generate step: ran None when it did not run, False when its self-check
    refused the compiled path (its numbers are then plain generate's: not reported as the fast path's)."""
    lines = sections(folder, "more.txt").get("step, --fast-generate")
    result = [line for line in lines or [] if line.startswith("RESULT")]
    if not result:
        return None, {}
    if "REFUSED" in result[-1] or "fast generate" not in result[-1]:
        return False, {}
    return True, table_ratios(lines)


def alone_runs(folder):
    """{side: {"peak": MiB, "before_step": MiB, "seconds": [s per step]}} from step.txt's "step, SIDE alone" steps
    (step_time.py --only SIDE, each a fresh process: its RESULT line; its first step on a cold CUDA)."""
    runs = {}
    for name, lines in sections(folder, "step.txt").items():
        side = re.match(r"^(?:step|memory), (\w+) alone$", name)
        for line in lines:
            if side and line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
                peak, before = result["memory"]
                runs[side.group(1)] = {"peak": peak, "before_step": before, "seconds": result.get("seconds", [])}
    return runs


def step_rows(numbers):
    """[(row, measured, floor, ratio)] of the one-pass side, then each side's s/step and the quoted ratios."""
    rows, sides = [], numbers.get("sides", {})
    for name, phase in sides.get("one_pass", {}).get("phases", {}).items():
        rows.append(("  " * phase["part"] + name, phase["measured_s"], phase["floor_s"], phase["ratio"]))
    for key, side in sides.items():
        rows.append((f"{side['name']}: s/step (first step)", side["s_per_step"], side.get("first_step_s"), None))
    return rows


def steady(seconds):
    """A run's steady s/step: the median of its steps after the first (the first, when it is the only one)."""
    later = sorted(seconds[1:] or seconds)
    return later[(len(later) - 1) // 2] if later else None


def target_rows(numbers):
    """[(target, measured ratio or None or "refused", limit)]: issue 63's, from step.json (ours alone), step.txt (each
    side alone: ours / TRL, memory, first step) and more.txt (--fast-generate)."""
    folder = numbers.get("_folder", "")
    sides, ratios = numbers.get("sides", {}), numbers.get("ratios", {})
    phases = sides.get("one_pass", {}).get("phases", {})
    rows = [(what, (phases.get(phase) or {}).get("ratio"), limit) for what, phase, limit in TARGETS]
    runs = alone_runs(folder)
    ours_over_trl = ratios.get("one_pass_over_trl")
    if ours_over_trl is None and {"ours", "trl"} <= runs.keys() and steady(runs["trl"]["seconds"]):
        ours_over_trl = steady(runs["ours"]["seconds"]) / steady(runs["trl"]["seconds"])  # each in its own process
    rows.append(("ours / TRL GRPOTrainer, s/step", ours_over_trl, 0.5))
    memory = numbers.get("memory_mib") or {}
    memory = {**{side: run for side, run in runs.items()}, **memory}
    rows.append(("ours / TRL, peak memory", memory["ours"]["peak"] / memory["trl"]["peak"]
                 if {"ours", "trl"} <= memory.keys() else None, 1.0))
    one_pass = sides.get("one_pass", {})
    rows.append(("first step / 3 steady steps", one_pass["first_step_s"] / (3 * one_pass["s_per_step"])
                 if one_pass.get("first_step_s") else None, 1.0))
    ran, fast = fast_generate_step(folder)
    for what, row, limit in (("--fast-generate step / its floor", "step", 8.0),
                             ("--fast-generate decode / its floor", "decode", 10.0)):
        rows.append((what, "refused" if ran is False else fast.get(row), limit))
    return rows


def memory_rows(folder):
    """[(setting, planned GiB, measured GiB, s/step)] from memory.txt's RESULT lines and its PLAN lines (a dry run)."""
    rows = []
    for line in read(folder, "memory.txt").splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            rows.append((f"{r['model']} {r.get('setting') or ''}".strip(), r["plan"]["peak"] / 2**30,
                         r["measured"]["peak"] / 2**30, sum(r["seconds"].values())))
        elif line.startswith("PLAN "):
            planned = re.search(r"planned ([\d.]+) GiB", line)
            rows.append((line[5:].split(":")[0], float(planned.group(1)) if planned else None, None, None))
    return rows


def number(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder")
    p.add_argument("--seconds", type=int, default=None, help="the check's wall time")
    p.add_argument("--deadline", type=int, default=None)
    p.add_argument("--skipped", default=None, help="a file of the steps skipped for time, a line each")
    args = p.parse_args(argv)
    print("GPU CHECK SUMMARY" + (f" ({args.seconds} s of a {args.deadline} s deadline)" if args.seconds and
                                 args.deadline else f" (a dry run: {args.seconds} s)" if args.seconds else ""))
    first = read(args.folder, "check.txt").splitlines()[:4]
    print("\n".join("  " + line for line in first))
    print("\ncheck                                          verdict")
    for name, verdict in verdicts(args.folder):
        print(f"{name:46s} {verdict}")
    text = read(args.folder, "step.json")
    numbers = {**(json.loads(text) if text.strip() else {}), "_folder": args.folder}
    if "sides" in numbers:
        print(f"\nstep ({numbers.get('device', '?')}; median of {numbers['steps']} after {numbers['warmup']})"
              f"{'':10s}measured s    floor s    ratio")
        for name, measured, floor_s, ratio in step_rows(numbers):
            print(f"{name:46s} {number(measured, 3):>10s} {number(floor_s, 3):>10s} {number(ratio, 1):>8s}")
        if numbers.get("trl_skipped"):
            print(f"TRL's side did not run: {numbers['trl_skipped']}")
    else:
        print("\nstep: no step.json (the step did not run or failed: step.txt)")
    print("\ntarget (issue 63)                              measured   at most  verdict")
    for what, value, limit in target_rows(numbers):
        verdict = "not measured" if value is None else "refused: plain generate ran" if value == "refused" else \
            "met" if value <= limit else "missed"
        print(f"{what:46s} {number(value if value != 'refused' else None):>8s} {limit:9.2f}  {verdict}")
    for side, run in alone_runs(args.folder).items():
        print(f"{side} alone (a fresh process): peak memory {run['peak']:.0f} MiB "
              f"({run['peak'] - run['before_step']:+.0f} MiB above its level before the first step); s per step "
              + ", ".join(f"{s:.2f}" for s in run["seconds"]))
    more = []
    for name, lines in sections(args.folder, "more.txt").items():
        more += [f"{name}:"] + ["  " + line for line in lines if line.startswith(
            ("RESULT", "fast generate's warm-up")) or re.match(r"^(step|  decode)\s+[\d.]+", line)]
    print("\nmore steps (random_model_step.py: one measured step after one warm-up)\n" + "\n".join(more or ["none"]))
    rows = memory_rows(args.folder)
    if rows:
        print("\nmemory setting                                  planned GiB  measured GiB  s/step")
        for name, planned, measured, seconds in rows:
            print(f"{name[:46]:46s} {number(planned):>11s} {number(measured):>13s} {number(seconds, 1):>7s}")
    skipped = [line for line in (open(args.skipped).read().splitlines() if args.skipped and
                                 os.path.isfile(args.skipped) else []) if line.strip()]
    print("\nskipped for time: " + ("; ".join(skipped) if skipped else "nothing"))


if __name__ == "__main__":
    main()
