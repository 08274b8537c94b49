"""The benchmark scripts run: the GPU check's shell script parses and answers --help, its random-model step
runs on a CPU at a tiny shape, step_time.py and floor.py print each phase against its floor (the GPU numbers
themselves come from benchmarks/gpu_check.sh on a GPU)."""
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import random_model_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_script_parses_and_answers_help():
    script = os.path.join(REPO, "benchmarks", "gpu_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    proc = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "Qwen2.5-0.5B" in proc.stdout


def test_self_check_forced_on_a_cpu_gives_its_verdict_and_cost(capsys, one_thread, monkeypatch):
    from benchmarks import self_check
    from fast import generate as fast_generate
    monkeypatch.setattr(fast_generate, "untested_device", fast_generate.untested_device)  # --force patches it
    self_check.main(["--force", "--shape", "test", "--repeats", "1", "--prompts", "2"])
    out = capsys.readouterr().out
    assert "tiny, fp32, default cache: match" in out and "test, fp32, default cache: match" in out
    assert "of a step (medians of 1, 1 thread(s)" in out


@pytest.mark.parametrize("extra", [[], ["--lopti"]])
def test_random_model_step_on_a_cpu(capsys, extra):
    random_model_step.main(["--shape", "test", "--device", "cpu", "--steps", "1", "--prompts", "2", "-M", "2",
                            "--max-new-tokens", "4", "--peak-tflops", "0.1", "--peak-gbps", "10", *extra])
    out = capsys.readouterr().out
    result = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert len(result) == 1 and "s/step" in result[0] and "peak RSS" in result[0]
    assert "test vs floor (median)" in out and "0.100 TFLOP/s, 10.0 GB/s (given)" in out


CHEAP_STEP_TIME = ["--no-memory", "--no-warm-start", "--steps", "1", "--warmup", "0", "--tiny-hidden", "32",
                   "--tiny-layers", "1", "--prompts-per-step", "2", "-M", "2", "--max-new-tokens", "4",
                   "--peak-tflops", "0.05", "--peak-gbps", "5"]  # a 1-layer tiny model at init, one step, given peaks


def test_step_time_prints_each_phase_against_its_floor(capsys, one_thread):
    """Our two sides on a 1-layer tiny model at init (no TRL, no memory subprocesses): the floor table per side."""
    from benchmarks import step_time
    step_time.main(["--only", "ours+lopti", *CHEAP_STEP_TIME])
    out = capsys.readouterr().out
    assert out.count("vs floor") == 2 and "  prefill" in out and "  decode" in out
    assert "peaks: 0.050 TFLOP/s, 5.0 GB/s (given)" in out
    step_rows = [line.split() for line in out.splitlines() if line.startswith("step ")]
    assert len(step_rows) == 2 and all(float(row[1]) > 0 and float(row[2]) > 0 for row in step_rows)


def test_floor_alone_for_a_known_shape_and_gpu(capsys):
    from benchmarks import floor
    floor.main(["--shape", "qwen2.5-0.5b", "--gpu", "H200", "--lopti"])
    out = capsys.readouterr().out
    assert "494M params" in out and "no-grad forwards" in out and "H200 datasheet, bf16 dense" in out


def test_gpu_checks_memory_settings_each_parse_and_plan(capsys):
    # every setting step 6 of gpu_check.sh runs on a GPU, planned here (what its --dry-run prints): a flag the
    # benchmark does not take, or a plan that fails, shows on a CPU before any GPU time is spent
    import re
    import shlex

    from benchmarks import memory_check
    script = open(os.path.join(REPO, "benchmarks", "gpu_check.sh")).read()
    settings = re.findall(r'^  "(qwen2\.5-[\d.]+b)\|([^"]*)"', script, flags=re.M)
    shape_flags = shlex.split(re.search(r'^MEMORY_SHAPE_FLAGS="([^"]*)"', script, flags=re.M).group(1))
    assert len(settings) >= 9 and any("--optimizer-offload" in f for _, f in settings) and \
        any("--base-dtype nf4" in f for _, f in settings) and any("adamw8bit" in f for _, f in settings)
    for shape, flags in settings:
        plan = memory_check.main(["--plan-only", "--model", shape, "--device", "cuda", *shape_flags, *shlex.split(flags),
                                  "--setting=" + flags])
        assert plan["peak"] > 0 and (plan["offloaded"] > 0) == ("--optimizer-offload" in flags)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("PLAN ")]
    assert len(lines) == len(settings) and "GiB in CPU memory" in lines[2]


def test_self_check_on_a_cpu_without_force_gives_every_verdict(capsys, one_thread, monkeypatch):
    """Before: without --force the check never ran on a CPU and the script ended in KeyError: False. Under bf16
    autocast, as a CUDA run computes."""
    from benchmarks import self_check
    from fast import generate as fast_generate
    monkeypatch.setattr(fast_generate, "untested_device", fast_generate.untested_device)  # main forces the check
    self_check.main(["--shape", "test", "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert "tiny, bf16, default cache: match" in out and "test, bf16, default cache, no shared prefill: match" in out
    assert "self-check: every path matches" in out and "of a step" not in out


def test_step_time_counts_trained_rows_on_the_rollouts_device():
    """The first CUDA run: advantages on the host, the completion mask on cuda:0 (a meta tensor stands in)."""
    from benchmarks import step_time
    mask = torch.ones(4, 3, device="meta")
    assert step_time.trained_rows(torch.tensor([0.0, 1.0, -1.0, 0.0]), mask).device == mask.device
    assert step_time.trained_rows(torch.tensor([0.0, 1.0, -1.0, 0.0]), torch.ones(4, 3)).item() == 0.5


def test_step_time_memory_subprocesses_do_not_inherit_json(monkeypatch):
    """Before: both memory subprocesses got --json and failed ("not with --only ours / trl")."""
    from benchmarks import step_time
    commands = []

    def fake_run(command, **_):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, stdout='RESULT {"memory": [2.0, 1.0]}\n', stderr="")
    monkeypatch.setattr(step_time.subprocess, "run", fake_run)
    memory = step_time.measure_memory_in_subprocesses(["ours", "trl"], ["--json", "a.json", "--steps", "2",
                                                                        "--json=b.json", "--preset", "gpu"])
    assert memory == {"ours": [2.0, 1.0], "trl": [2.0, 1.0]}
    assert all("--json" not in " ".join(c) and "a.json" not in c and "--preset" in c for c in commands)


def test_step_time_gpu_preset_builds_its_random_model_without_a_download(capsys, one_thread):
    """--preset gpu is a random model of Qwen2.5-0.5B's shape (no network); here its smoke-test shape on a CPU."""
    from benchmarks import step_time
    assert step_time.PRESETS["gpu"]["random_shape"] == "qwen2.5-0.5b" and "--model" not in step_time.PRESETS["gpu"]
    step_time.main(["--random-shape", "test", "--device", "cpu", "--dtype", "fp32", "--only", "ours+lopti",
                    *CHEAP_STEP_TIME[:4], "--prompts-per-step", "2", "-M", "2", "--max-new-tokens", "4",
                    "--peak-tflops", "0.05", "--peak-gbps", "5"])
    out = capsys.readouterr().out
    assert "workload: random test" in out and out.count("vs floor") == 2


@pytest.mark.slow
def test_step_time_random_shape_against_trl_with_json(tmp_path, one_thread):
    """What --preset gpu runs on a GPU, at the smoke-test shape on a CPU: TRL's side, the memory subprocesses, --json."""
    pytest.importorskip("trl")
    import json
    path = tmp_path / "step.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "step_time.py"), "--random-shape", "test",
                           "--device", "cpu", "--dtype", "fp32", "--steps", "1", "--warmup", "1",
                           "--prompts-per-step", "2", "-M", "2", "--max-new-tokens", "4", "--peak-tflops", "0.05",
                           "--peak-gbps", "5", "--threads", "1", "--json", str(path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "memory, trl alone" in proc.stdout and "memory, ours alone" in proc.stdout
    numbers = json.loads(path.read_text())
    assert {"one_pass", "lopti", "trl"} <= numbers["sides"].keys() and "one_pass_over_trl" in numbers["ratios"]


def test_gpu_summary_reads_verdicts_targets_and_what_was_skipped(tmp_path, capsys):
    """The closing table from a folder as gpu_check.sh leaves it: a refused self-check is named, a target without a
    number is 'not measured', never 'met'."""
    import json
    from benchmarks import gpu_summary
    (tmp_path / "check.txt").write_text("date\npython x\nNVIDIA H200\ntorch 2.11\nprobe: 700 TFLOP/s bf16\n"
                                        "tiny, bf16, roomy cache: match (check 0.1 s)\n"
                                        "qwen2.5-0.5b, bf16, compiled: REFUSED (check 9.0 s)\n"
                                        "before RL (after warm start)       0.115   0.023   0.115\n"
                                        "after RL (step 100)                0.590   0.035   0.590\n"
                                        "=== tiny default: exit 0 after 57 s (estimate 75 s)\n")
    phases = {"rollout": dict(measured_s=6.1, floor_s=0.066, ratio=91.8, part=False),
              "decode": dict(measured_s=5.78, floor_s=0.066, ratio=87.5, part=True),
              "update": dict(measured_s=0.3, floor_s=0.1, ratio=3.0, part=False)}
    (tmp_path / "step.json").write_text(json.dumps({
        "steps": 3, "warmup": 1, "device": "NVIDIA H200", "trl_skipped": "TRL is not installed", "ratios": {},
        "sides": {"one_pass": {"name": "ours, one pass", "s_per_step": 8.23, "first_step_s": 21.6,
                               "phases": phases}}}))
    skipped = tmp_path / "skipped"
    skipped.write_text("step, qwen2.5-1.5b (~60 s, 12 s left)\n")
    gpu_summary.main([str(tmp_path), "--seconds", "390", "--deadline", "400", "--skipped", str(skipped)])
    out = capsys.readouterr().out
    assert "self-check qwen2.5-0.5b, bf16, compiled        REFUSED" in out
    assert "exit 0, 57 s wall, held-out pass@1 0.115 -> 0.590 at step 100" in out
    lines = {line[:46].strip(): line[46:].split() for line in out.splitlines()}
    assert lines["step / its floor"] == ["-", "8.00", "not", "measured"]  # no step row: not measured, not met
    assert lines["decode / its floor"][-1] == "missed" and lines["update / its floor"][-1] == "met"
    assert lines["ours / TRL GRPOTrainer, s/step"][-2:] == ["not", "measured"]
    assert lines["first step / 3 steady steps"][0] == "0.87"  # 21.6 / (3 x 8.23)
    assert "skipped for time: step, qwen2.5-1.5b (~60 s, 12 s left)" in out and "TRL's side did not run" in out


@pytest.mark.slow
def test_gpu_check_dry_run_walks_every_step_on_this_cpu(tmp_path):
    """What a GPU run of gpu_check.sh will do, on this CPU with tiny shapes: every step exits 0, at most 8 files, and
    the closing table has each section (docs/tests.md: ~2 min unloaded)."""
    proc = subprocess.run(["bash", os.path.join(REPO, "benchmarks", "gpu_check.sh"), "--dry-run"], cwd=REPO,
                          env={**os.environ, "OUT": str(tmp_path / "out")}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(os.listdir(tmp_path / "out"))
    assert len(files) <= 8 and "summary.txt" in files and "step.json" in files, files
    exits = [line for name in files for line in open(tmp_path / "out" / name) if line.startswith("=== ")
             and ": exit " in line]
    assert len(exits) >= 8 and all(": exit 0 after" in line for line in exits), exits
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for section in ("self-check tiny, bf16, default cache", "tiny default (python train.py)", "step / its floor",
                    "ours / TRL, peak memory", "memory setting", "skipped for time: nothing"):
        assert section in summary, section
    assert "self-check: every path matches" in (tmp_path / "out" / "check.txt").read_text()


def test_gpu_summary_reads_each_side_alone_and_never_calls_a_refused_fast_path_fast(tmp_path, capsys):
    """Part 1 as gpu_check.sh leaves it: ours and TRL each alone in a fresh process (ours / TRL from their steady
    steps, memory from their peaks), the --fast-generate step whose self-check refused the compiled path: its targets
    say so, not plain generate's numbers as the fast path's."""
    from benchmarks import gpu_summary
    (tmp_path / "step.txt").write_text('=== [30 s] step, ours alone: python step_time.py --only ours\n'
                                       'fast-path self-check (2 rows x 4 greedy tokens): the shared prefill into '
                                       "HF's cache match plain generate\n"
                                       'RESULT {"memory": [18000.0, 2000.0], "seconds": [21.0, 8.0]}\n'
                                       '=== step, ours alone: exit 0 after 45 s (estimate 50 s)\n'
                                       '=== [75 s] step, trl alone: python step_time.py --only trl\n'
                                       'RESULT {"memory": [24000.0, 4000.0], "seconds": [25.0, 10.0]}\n')
    (tmp_path / "more.txt").write_text(
        "=== [140 s] step, --fast-generate: python benchmarks/random_model_step.py --fast-generate\n"
        "fast-path self-check (2 rows x 4 greedy tokens): the static cache and compiled generate FAILED on this "
        "device (RuntimeError: x): generating with the plain call for this run\n"
        "RESULT qwen2.5-0.5b | one pass | fast generate REFUSED by its self-check (plain generate ran) | 7.3 s/step\n"
        "step                                          7.3000     0.1694     43.1  \n"
        "=== step, --fast-generate: exit 0 after 60 s (estimate 120 s)\n")
    gpu_summary.main([str(tmp_path)])
    out = capsys.readouterr().out
    lines = {line[:46].strip(): line[46:].split() for line in out.splitlines()}
    assert lines["ours / TRL, peak memory"][-2:] == ["1.00", "met"] and lines["ours / TRL, peak memory"][0] == "0.75"
    assert lines["ours / TRL GRPOTrainer, s/step"][0] == "0.80"  # 8.0 / 10.0, each side's steady step alone
    assert lines["--fast-generate step / its floor"][-4:] == ["refused:", "plain", "generate", "ran"]
    assert "trl alone (a fresh process): peak memory 24000 MiB (+20000 MiB above" in out
    assert "fast path in 'step, --fast-generate'" in out and "FAILED" in out
    assert "match plain generate" in " ".join(lines["fast path in 'step, ours alone'"])


def autocast_seen(model, seen):
    """Record (grad enabled, CPU autocast on) at every decoder layer's forward of `model`; returns it."""
    for layer in model.get_decoder().layers:
        layer.register_forward_pre_hook(lambda module, inputs: seen.add(
            (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"))))
    return model


def test_benchmarks_run_the_step_under_the_precision_train_py_runs_it(tmp_path, digits_task, monkeypatch):
    """--dtype bf16 on a CPU: every decoder-layer forward of train.py's step (its rollout without gradients, its update
    with) runs under autocast, and so does each benchmark's (random_model_step.py, step_time.py, memory_check.py).
    Before issue 67 the benchmarks called collect_rollouts bare: their rollouts ran in fp32. Each builds train.py's
    optimizer (policy.adamw_class: fused AdamW on CUDA); before issue 73 two built torch.optim.AdamW (foreach)."""
    from benchmarks import memory_check, step_time
    from harness import policy
    from tests.stubs import SMALL_TRAIN
    import train
    seen = {name: set() for name in ("train.py", "random_model_step", "step_time", "memory_check")}
    build_policy, build_shape, fused_adamw = policy.build_policy, random_model_step.build, policy.fused_adamw
    built = []  # the optimizers built through train.py's adamw_class
    monkeypatch.setattr(policy, "fused_adamw", lambda *a, **k: built.append(1) or fused_adamw(*a, **k))
    monkeypatch.setattr(train.policy, "build_policy", lambda *a, **k: (lambda m, ref: (autocast_seen(m, seen["train.py"]),
                                                                              ref))(*build_policy(*a, **k)))
    train.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL_TRAIN, "--steps", "1",
                "--device", "cpu", "--dtype", "bf16"])
    small = ["-M", "2", "--max-new-tokens", "4"]
    for name, run_it in [
            ("random_model_step", lambda: random_model_step.main(
                ["--shape", "test", "--device", "cpu", "--dtype", "bf16", "--steps", "1", "--prompts", "2", *small,
                 "--peak-tflops", "0.1", "--peak-gbps", "10"])),
            ("step_time", lambda: step_time.main(
                ["--random-shape", "test", "--device", "cpu", "--dtype", "bf16", "--only", "ours", "--no-memory",
                 "--steps", "1", "--warmup", "0", "--prompts-per-step", "2", "--num-generations", "2",
                 "--max-new-tokens", "4", "--threads", "1"])),
            ("memory_check", lambda: memory_check.main(
                ["--model", "test", "--device", "cpu", "--dtype", "bf16", "--prompts", "2", *small,
                 "--micro-batch", "2", "--threads", "1"]))]:
        monkeypatch.setattr(random_model_step, "build", lambda *a, _name=name, **k: (lambda m, t: (
            autocast_seen(m, seen[_name]), t))(*build_shape(*a, **k)))
        built.clear()
        run_it()
        assert built, f"{name} built its own optimizer, not train.py's"
    assert seen["train.py"] == {(False, True), (True, True)}  # rollout and update, both under autocast
    for name in ("random_model_step", "step_time", "memory_check"):
        assert seen[name] == seen["train.py"], name


def test_gpu_check_parts_fit_their_deadlines_with_margin():
    """gpu_check.sh's PLAN: each part's estimates (sized from the H200 logs; the memory loop's, one a setting) sum to
    at most 85 % of its deadline, each deadline within one device call (600 s); parts 1 and 2 with a device start
    (2 min, the worst seen) fit one session's 15 device minutes, parts 3 and 4 one each; part 1 holds issue 63's
    targets (the step alone per side, the --fast-generate step at ours alone's micro-batch: train.py's default) and
    part 2 the 1.5B and 3B steps, the profile (its ~0.8M events at 256 tokens) is part 3's at 64 tokens. Before issue
    67 the estimates summed to ~1 200 s against one 420 s deadline; before issue 73 part 3 held ~570 s of memory
    settings in its 225 s left and the --fast-generate step ran micro-batch 16 against ours alone's 64."""
    import fnmatch
    import re
    import shlex

    from harness import flags
    script = open(os.path.join(REPO, "benchmarks", "gpu_check.sh")).read()
    plan = [row.split("|") for row in re.findall(r'^  "([1-4]\|\d+\|[^"]+)"$', script, flags=re.M)]
    deadlines = [int(x) for x in re.search(r"^PART_DEADLINES=\(([\d ]+)\)", script, flags=re.M).group(1).split()]
    settings = re.findall(r'^  "(qwen2\.5-[\d.]+b)\|([^"]*)"', script, flags=re.M)
    of = lambda name: next((int(p), int(e)) for p, e, pattern, _ in plan if fnmatch.fnmatchcase(name, pattern))  # noqa
    steps = [of(name) for _, _, name, _ in plan if "*" not in name] + \
        [of(f"memory {shape} {flags_ or '(as written)'}") for shape, flags_ in settings]
    for part in (1, 2, 3, 4):
        total = sum(estimate for p, estimate in steps if p == part)
        assert 0 < total <= 0.85 * deadlines[part] <= 600, (part, total, deadlines[part])
    assert 120 + deadlines[1] + deadlines[2] + 2 * 20 <= 900  # + each call's wheels, summary and transfer
    assert all(120 + deadlines[part] + 20 <= 900 for part in (3, 4))
    names = {part: [name for p, _, name, _ in plan if int(p) == part] for part in (1, 2, 3)}
    assert names[1] == ["peaks", "step, ours alone", "step, trl alone", "step, --fast-generate"]
    assert {"step, 1.5b", "step, 3b", "step, roomy cache"} == set(names[2]) and "profile" in names[3]
    fast = re.search(r'"step, --fast-generate" (.*?)# ', script, flags=re.S).group(1)
    assert int(shlex.split(fast)[shlex.split(fast).index("--micro-batch") + 1]) == flags.Config().micro_batch
    assert "PROFILE=(--max-new-tokens 64)" in script and '--profile torch "${PROFILE[@]}"' in script
    used = set(re.findall(r'^\s*step \S+ "([^"$]+)"', script, flags=re.M)) - {"memory plans"}  # (memory *)
    assert used <= {name for _, _, name, _ in plan} and len(used) >= 9, used  # every step has its estimate
