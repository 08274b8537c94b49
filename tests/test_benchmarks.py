"""The benchmark scripts run: the GPU check's shell script parses and answers --help, its random-model step
runs on a CPU at a tiny shape, step_time.py and floor.py print each phase against its floor (the GPU numbers
themselves come from benchmarks/gpu_check.sh on a GPU)."""
import json
import os
import re
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


@pytest.mark.parametrize("extra", [[], ["--lopti"], ["--generate", "loop", "--warmup", "2"]])
def test_random_model_step_on_a_cpu(capsys, extra):
    numbers = random_model_step.main([
        "--shape", "test", "--device", "cpu", "--steps", "1", "--prompts", "2", "-M", "2",
        "--max-new-tokens", "4", "--peak-tflops", "0.1", "--peak-gbps", "10", *extra])
    out = capsys.readouterr().out
    result = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert len(result) == 1 and "s/step" in result[0] and "peak RSS" in result[0]
    assert "test vs floor (median)" in out and "0.100 TFLOP/s, 10.0 GB/s (given)" in out
    warmup = 2 if "--warmup" in extra else 1
    steps = [line for line in out.splitlines() if re.match(r"step \d+: ", line)]
    assert len(steps) == warmup + 1 and sum("(warm-up)" in line for line in steps) == warmup
    path = "loop" if "loop" in extra else "plain"
    assert numbers["path"] == numbers["ran"] == path and f"generate {path} |" in result[0]
    assert numbers["ms_per_token"] == pytest.approx(1e3 * numbers["decode_s"] / 4)
    assert numbers["step_s"] > numbers["decode_s"] > 0
    assert numbers["step_floor_s"] > numbers["decode_floor_s"] > 0
    assert numbers["launches_per_token"] is None
    assert out.splitlines()[-1] == "GENERATE " + json.dumps(numbers)


def test_hf_static_path_is_generate_with_the_static_cache_and_its_compile_config():
    """--generate hf-static: model.generate (patched only inside the benchmark) with
    cache_implementation "static" and a fullgraph CompileConfig, compiled on every device (inductor
    with CUDA graphs on CUDA; dynamo's eager backend on a CPU, the dry run's trace check); plain and
    loop leave generate alone."""
    class Model(torch.nn.Linear):
        def generate(self, *args, **kwargs):
            return kwargs

    model = Model(1, 1)
    for device, backend, mode in (("cuda", "inductor", "reduce-overhead"),
                                  ("cpu", "eager", "default")):
        model.device = torch.device(device)  # (a Hugging Face model's attribute)
        with random_model_step.generate_path("hf-static", model):
            kwargs = model.generate(max_new_tokens=4, do_sample=True)
        config = kwargs["compile_config"]
        assert kwargs["cache_implementation"] == "static" and kwargs["do_sample"] is True
        assert (config.backend, config.mode) == (backend, mode)
        assert config.fullgraph and config.dynamic is False and config._compile_all_devices
        assert "generate" not in vars(model)  # the class's method again
    for path in ("plain", "loop"):
        with random_model_step.generate_path(path, model):
            assert model.generate(a=1) == {"a": 1}
    ran = random_model_step.path_ran
    assert ran(model, "hf-static") == "plain"  # generate did not compile: plain generate ran
    model._compiled_call = object()
    model._fast_generate = {"off": "--fast-generate (128 rows) FAILED"}
    assert ran(model, "hf-static") == "hf-static"
    assert ran(model, "loop") == "plain" and ran(model, "plain") == "plain"


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
    """The closing table from a folder as gpu_check.sh leaves it: the tiny default's verdict, a
    target without a number is 'not measured', never 'met'."""
    from benchmarks import gpu_summary
    (tmp_path / "check.txt").write_text("date\npython x\nNVIDIA H200\ntorch 2.11\nprobe: 700 TFLOP/s bf16\n"
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
    assert "exit 0, 57 s wall, held-out pass@1 0.115 -> 0.590 at step 100" in out
    lines = {line[:46].strip(): line[46:].split() for line in out.splitlines()}
    assert lines["step / its floor"] == ["-", "8.00", "not", "measured"]  # no step row: not measured, not met
    assert lines["decode / its floor"][-1] == "missed" and lines["update / its floor"][-1] == "met"
    assert lines["ours / TRL GRPOTrainer, s/step"][-2:] == ["not", "measured"]
    assert lines["first step / 3 steady steps"][0] == "0.87"  # 21.6 / (3 x 8.23)
    assert "skipped for time: step, qwen2.5-1.5b (~60 s, 12 s left)" in out and "TRL's side did not run" in out
    assert "the CUDA default): not decided: loop did not run" in out  # no generate path ran


@pytest.mark.slow
def test_gpu_check_dry_run_walks_every_step_on_this_cpu(tmp_path):
    """What a GPU run of gpu_check.sh will do, on this CPU with tiny shapes: every step exits 0, at most 8 files, and
    the closing table has each section, each generate path measured as itself (docs/tests.md:
    minutes)."""
    proc = subprocess.run(["bash", os.path.join(REPO, "benchmarks", "gpu_check.sh"), "--dry-run"], cwd=REPO,
                          env={**os.environ, "OUT": str(tmp_path / "out")}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(os.listdir(tmp_path / "out"))
    assert len(files) <= 8 and "summary.txt" in files and "step.json" in files, files
    exits = [line for name in files for line in open(tmp_path / "out" / name) if line.startswith("=== ")
             and ": exit " in line]
    assert len(exits) >= 10 and all(": exit 0 after" in line for line in exits), exits
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for section in ("tiny default (python train.py)", "step / its floor", "ours / TRL, peak memory",
                    "memory setting", "skipped for time: nothing", "loop: decode / its floor",
                    "hf-static: step / its floor", f"{'generate, loop':46s} no self-check"):
        assert section in summary, section
    table = [line.split() for line in summary.splitlines()
             if line.startswith(("loop ", "plain ", "hf-static "))]
    assert [row[:2] for row in table] == [[path, path] for path in ("loop", "plain", "hf-static")]
    assert all(float(row[3]) > 0 for row in table)  # aten ops a token on a CPU: each path counted
    assert re.search(r"the CUDA default\): (loop|hf-static): step", summary)


def generate_section(path, warmup_lines=(), **numbers):
    """step.txt's section of part 1's "generate, PATH" step: its lines, then its GENERATE numbers
    (decode_s None: none)."""
    base = dict(path=path, ran=path, device="NVIDIA H100 80GB HBM3", rows=128, tokens=256,
                micro_batch=64, ms_per_token=3.0, launches_per_token=1213.0, launches="kernels",
                decode_s=0.768, decode_floor_s=0.0947, step_s=1.5, step_floor_s=0.2269,
                first_step_s=40.0, peak_gib=12.0)
    lines = [f"=== [20 s] generate, {path}: python random_model_step.py --generate {path}",
             *warmup_lines]
    if numbers.get("decode_s", 0) is not None:
        lines.append("GENERATE " + json.dumps({**base, **numbers}))
    return "\n".join(lines + [f"=== generate, {path}: exit 0 after 50 s (estimate 60 s)"]) + "\n"


def test_gpu_summary_sets_the_generate_paths_side_by_side(tmp_path, capsys):
    """Part 1 as gpu_check.sh leaves it: the loop (its two self-check lines), plain generate, HF's
    static path; each path's targets (decode <= 10x, step <= 8x its floor), the faster of the loop
    and HF's static path. A path that ran plain generate instead is "refused", never measured as
    itself; one whose step failed is named. Part 2's sides alone: ours / TRL from their steady
    steps, memory from their peaks."""
    from benchmarks import gpu_summary
    checks = [f"--fast-generate self-check (128 rows, call {call}): the CUDA graphs give the eager "
              "steps' tokens" for call in (1, 2)]
    (tmp_path / "step.txt").write_text(
        generate_section("loop", checks)
        + generate_section("plain", decode_s=5.0, step_s=6.0, ms_per_token=19.5)
        + generate_section("hf-static", step_s=2.0, decode_s=1.1)
        + '=== [300 s] step, ours alone: python step_time.py --only ours\n'
        'RESULT {"memory": [18000.0, 2000.0], "seconds": [21.0, 8.0]}\n'
        '=== step, ours alone: exit 0 after 45 s (estimate 50 s)\n'
        '=== [345 s] step, trl alone: python step_time.py --only trl\n'
        'RESULT {"memory": [24000.0, 4000.0], "seconds": [25.0, 10.0]}\n')
    gpu_summary.main([str(tmp_path)])
    out = capsys.readouterr().out
    lines = {line[:46].strip(): line[46:].split() for line in out.splitlines()}
    assert lines["loop: decode / its floor"] == ["8.11", "10.00", "met"]  # 0.768 / 0.0947
    assert lines["loop: step / its floor"] == ["6.61", "8.00", "met"]
    assert lines["plain: step / its floor"][-1] == "missed"
    assert lines["hf-static: decode / its floor"][-1] == "missed"  # 1.1 / 0.0947 = 11.6
    assert "the CUDA default): loop: step 1.50 s against hf-static's 2.00 s (25% less)" in out
    table = {line.split()[0]: line.split() for line in out.splitlines()
             if line.startswith(("loop ", "plain "))}
    assert table["loop"][1:5] == ["loop", "3.00", "1213", "0.768"] and table["plain"][2] == "19.50"
    verdicts = [line[46:].strip() for line in out.splitlines()
                if line.startswith("generate, loop ")]
    assert verdicts == [check[len("--fast-generate "):] for check in checks]
    assert lines["ours / TRL, peak memory"] == ["0.75", "1.00", "met"]
    assert lines["ours / TRL GRPOTrainer, s/step"][0] == "0.80"  # 8.0 / 10.0, each side alone
    assert "trl alone (a fresh process): peak memory 24000 MiB (+20000 MiB above" in out

    refused = ("--fast-generate (128 rows) FAILED on this device (RuntimeError: x): generating "
               "with the plain call")
    (tmp_path / "step.txt").write_text(generate_section("loop", [refused], ran="plain")
                                       + generate_section("hf-static", decode_s=None))
    gpu_summary.main([str(tmp_path)])
    out = capsys.readouterr().out
    lines = {line[:46].strip(): line[46:].split() for line in out.splitlines()}
    assert lines["loop: step / its floor"][-4:] == ["refused:", "plain", "generate", "ran"]
    assert "the CUDA default): not decided: loop refused: plain generate ran" in out
    assert "hf-static  failed: no GENERATE line (step.txt)" in out
    assert f"{'generate, loop':46s} (128 rows) FAILED on this device" in out


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
    (2 min, the worst seen) fit one session's 15 device minutes, parts 3 and 4 one each. Part 1 is
    issue 80's decision and nothing else, first: the step with the decode loop, plain generate and
    HF's static path, each at ours alone's micro-batch (train.py's default), the loop's self-check
    in its warm-up steps, kernels a token (before: the loop's step ran last, after TRL's, skipped
    in about one lend in three). Part 2 holds issue 63's sides alone; the profile (its ~0.8M events
    at 256 tokens) is part 3's at 64 tokens."""
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
    assert names[1] == ["peaks", "generate, loop", "generate, plain", "generate, hf-static"]
    assert names[2] == ["step, ours alone", "step, trl alone", "step, 1.5b"]
    assert "profile" in names[3]
    part1 = script[script.index("if in_part 1; then"):script.index("if in_part 2; then")]
    assert re.search(r"^  for path in loop plain hf-static; do$", part1, flags=re.M)  # PLAN's order
    command = re.search(r'"generate, \$path" (.*?)\n  done', part1, flags=re.S).group(1)
    command = shlex.split(command.replace("\\\n", ""))
    assert command[command.index("--micro-batch") + 1] == str(flags.Config().micro_batch)
    assert {"--per-token", "--generate", "$path", "--warmup", "$warmup"} <= set(command)
    assert "warmup=1; [[ $path == loop ]] && warmup=2" in part1  # the self-check: warm-up steps
    assert "PROFILE=(--max-new-tokens 64)" in script and '--profile torch "${PROFILE[@]}"' in script
    used = set(re.findall(r'^\s*step \S+ "([^"$]+)"', script, flags=re.M)) - {"memory plans"}  # (memory *)
    used |= {f"generate, {path}" for path in ("loop", "plain", "hf-static")}
    assert used <= {name for _, _, name, _ in plan} and len(used) >= 10, used  # each its estimate
    assert "self_check.py" not in script and "roomy" not in script  # gone with their paths
