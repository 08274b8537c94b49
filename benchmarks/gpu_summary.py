"""benchmarks/gpu_check.sh's closing table, read back from its output folder: the generate paths
(issue 80), each check's verdict, the step's phases against their floors, issue 63's targets.

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
# issue 80's, per generate path at micro-batch 64: (what, its GENERATE numbers' keys, at most)
PATH_TARGETS = [("decode / its floor", "decode_s", "decode_floor_s", 10.0),
                ("step / its floor", "step_s", "step_floor_s", 8.0)]


def read(folder, name):
    path = os.path.join(folder, name)
    return open(path, errors="replace").read() if os.path.isfile(path) else ""


def sections(folder, name):
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
    text, rows = read(folder, "check.txt"), []
    for line in text.splitlines():
        if line.startswith("probe:"):
            rows.append(("peaks", line[len("probe: "):]))
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
                if line.startswith("--fast-generate"):  # a self-check's verdict, refusal, failure
                    rows.append((step, line.removeprefix("--fast-generate").lstrip(": ")))
            if step == "generate, loop" and not any(line.startswith("--fast-generate")
                                                    for line in lines):
                rows.append((step, "no self-check line (it runs on CUDA only: a CPU's loop is the "
                             "tests')"))
    return rows


def generate_paths(folder):
    found = {}
    for name, lines in sections(folder, "step.txt").items():
        if name.startswith("generate, "):
            numbers = [json.loads(line[len("GENERATE "):]) for line in lines
                       if line.startswith("GENERATE ")]
            found[name[len("generate, "):]] = numbers[-1] if numbers else None
    return found


def path_rows(paths):
    rows = []
    for path, numbers in paths.items():
        for what, measured, floor_s, limit in PATH_TARGETS:
            value = None if not numbers or not numbers.get(floor_s) or \
                numbers.get(measured) is None else "refused" if numbers["ran"] != path else \
                numbers[measured] / numbers[floor_s]
            rows.append((path, what, value, limit))
    return rows


def faster_path(paths, candidates=("loop", "hf-static")):
    steps = {}
    for path in candidates:
        numbers = paths.get(path)
        if not numbers or numbers["ran"] != path:
            why = "did not run" if path not in paths else "failed (step.txt)" if not numbers else \
                "refused: plain generate ran"
            return f"not decided: {path} {why}"
        steps[path] = numbers["step_s"]
    fast, slow = sorted(candidates, key=steps.get)
    return (f"{fast}: step {steps[fast]:.2f} s against {slow}'s {steps[slow]:.2f} s "
            f"({1 - steps[fast] / steps[slow]:.0%} less)")


def alone_runs(folder):
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
    folder = numbers.get("_folder", "")
    sides, ratios = numbers.get("sides", {}), numbers.get("ratios", {})
    phases = sides.get("one_pass", {}).get("phases", {})
    rows = [(what, (phases.get(phase) or {}).get("ratio"), limit) for what, phase, limit in TARGETS]
    runs = alone_runs(folder)
    ours_over_trl = ratios.get("one_pass_over_trl")
    if ours_over_trl is None and {"ours", "trl"} <= runs.keys() and steady(runs["trl"]["seconds"]):
        ours_over_trl = steady(runs["ours"]["seconds"]) / steady(runs["trl"]["seconds"])  # each in its own process
    rows.append(("ours / TRL GRPOTrainer, s/step", ours_over_trl, 0.5))
    memory = {**runs, **(numbers.get("memory_mib") or {})}
    rows.append(("ours / TRL, peak memory", memory["ours"]["peak"] / memory["trl"]["peak"]
                 if {"ours", "trl"} <= memory.keys() else None, 1.0))
    one_pass = sides.get("one_pass", {})
    rows.append(("first step / 3 steady steps", one_pass["first_step_s"] / (3 * one_pass["s_per_step"])
                 if one_pass.get("first_step_s") else None, 1.0))
    return rows


def memory_rows(folder):
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


def print_generate_paths(paths):
    shown = next((n for n in paths.values() if n), {})
    print(f"\ngenerate path (step.txt: {shown.get('rows', '?')} rows x {shown.get('tokens', '?')} "
          f"tokens, micro-batch {shown.get('micro_batch', '?')}, {shown.get('device', '?')})")
    launches = shown.get("launches", "kernels") + "/token"
    print(f"{'path':10s} {'ran':10s} {'ms/token':>8s} {launches:>14s} "
          f"{'decode s':>9s} {'x floor':>8s} {'step s':>8s} {'x floor':>8s} {'first s':>8s} "
          f"{'peak GiB':>9s}")
    for path, n in paths.items():
        if not n:
            print(f"{path:10s} failed: no GENERATE line (step.txt)")
            continue
        decode = n["decode_s"] / n["decode_floor_s"] if n.get("decode_floor_s") else None
        step = n["step_s"] / n["step_floor_s"] if n.get("step_floor_s") else None
        print(f"{path:10s} {n['ran']:10s} {number(n['ms_per_token']):>8s} "
              f"{number(n['launches_per_token'], 0):>14s} {number(n['decode_s'], 3):>9s} "
              f"{number(decode, 1):>8s} {number(n['step_s'], 3):>8s} {number(step, 1):>8s} "
              f"{number(n['first_step_s'], 1):>8s} {number(n['peak_gib'], 1):>9s}")
    print(f"\n{'target (issue 80, micro-batch 64)':46s} measured   at most  verdict")
    for path, what, value, limit in path_rows(paths):
        shown_value = number(value if value != "refused" else None)
        print(f"{path + ': ' + what:46s} {shown_value:>8s} {limit:9.2f}  "
              f"{verdict_of(value, limit)}")
    print(f"the faster of the loop and HF's static path (the CUDA default): {faster_path(paths)}")


def verdict_of(value, limit):
    return "not measured" if value is None else "refused: plain generate ran" \
        if value == "refused" else "met" if value <= limit else "missed"


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
    print_generate_paths(generate_paths(args.folder))
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
        print(f"{what:46s} {number(value):>8s} {limit:9.2f}  {verdict_of(value, limit)}")
    for side, run in alone_runs(args.folder).items():
        print(f"{side} alone (a fresh process): peak memory {run['peak']:.0f} MiB "
              f"({run['peak'] - run['before_step']:+.0f} MiB above its level before the first step); s per step "
              + ", ".join(f"{s:.2f}" for s in run["seconds"]))
    more = []
    for name, lines in sections(args.folder, "more.txt").items():
        more += [f"{name}:"] + ["  " + line for line in lines if line.startswith(
            ("RESULT", "first step")) or re.match(r"^(step|  decode)\s+[\d.]+", line)]
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
