"""lab/reproduce.py: a shipped cell rerun from scratch compares equal, and a changed number is reported."""
import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from lab import headline, reproduce, summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_cell_names_a_results_file_and_a_command(capsys):
    assert reproduce.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in reproduce.CELLS)
    assert "python -m lab.compare --preset countdown3 --configs softmax --seeds 12" in out
    # item 5's clipped case: the run, then referee_lopti on its checkpoint once per clip setting
    assert reproduce.command_text("lopti-offpolicy-seed0").split("; ", 1) == [
        "OMP_NUM_THREADS=1 python -m lab.compare --preset countdown3 --configs grpo --seeds 0 "
        "--output-dir RUNS",
        "OMP_NUM_THREADS=1 python -m lab.referee_lopti --checkpoint RUNS/countdown3/grpo-seed0/latest "
        "--task-option num_count=3 --seeds 0,1,2 --num-prompts 64 (metrics run_clip_*; lopti_clip_*: the same with "
        "--clip-low 0.2 --clip-high 0.24 --dual-clip 10)"]
    assert reproduce.command_text("step-time-smollm2-cpu") == ("OMP_NUM_THREADS=1 python benchmarks/step_time.py "
                                                               "--preset smollm2-cpu --steps 2 --warmup 1 --no-memory "
                                                               "--threads 1")



def test_every_cells_command_runs_a_module_that_exists_today(tmp_path, monkeypatch):
    # the cells.csv files keep the command of their commit (`python -m lab.smollm2_cpu` before issue 62 moved it to
    # experiments/); --list and a rerun name today's module
    for name in reproduce.CELLS:
        text = reproduce.command_text(name)
        for module in re.findall(r"python -m ([\w.]+)", text) + re.findall(r"([\w.]+)\.\w+\(", text):
            assert importlib.util.find_spec(module), f"{name}: {module}"
    ran = []

    def run(argv, environment):
        ran.append(argv)
        with open(os.path.join(argv[argv.index("--output-dir") + 1], "smollm2_cpu.csv"), "w") as f:
            f.write("step,reward,pass@1\n0,0.5,0.25\n")
    monkeypatch.setattr(reproduce, "run_quietly", run)
    assert reproduce.rerun("smollm2-cpu-seed0", str(tmp_path)) == {"reward_step0": 0.5, "pass@1_step0": 0.25}
    assert ran[0][1:5] == ["-m", "experiments.smollm2_cpu", "--seeds", "0"]


def test_the_identity_cell_reproduces_and_a_changed_number_differs(tmp_path, monkeypatch, capsys):
    assert reproduce.main(["table3-identity"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "reproduced: table3-identity"
    shutil.copytree(reproduce.RESULTS, tmp_path / "results")
    path = str(tmp_path / "results" / "table3_identity.csv")
    rows = reproduce.ledger_rows(path)
    rows[0]["value"] = str(float(rows[0]["value"]) + 0.001)  # what a stale row would say
    reproduce.write_results(path, rows)
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path / "results"))
    assert reproduce.main(["table3-identity"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "differs: table3-identity" and any(rows[0]["metric"] + " shipped" in line for line in out)
    assert f"difference {-0.001:+.6g}" in next(line for line in out if rows[0]["metric"] + " shipped" in line)
    assert out[-2].startswith(f"1 of {len(rows)} numbers differ; the largest difference 0.001 ({rows[0]['metric']})")


def test_the_fig1_cell_reproduces_the_exact_weights(capsys):
    assert reproduce.main(["fig1-prompt-weight"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "reproduced: fig1-prompt-weight"
    rows = reproduce.shipped("fig1-prompt-weight")
    assert float(rows["maxrl_p0"]["value"]) == 7.0 and float(rows["reinforce_p0.5"]["value"]) == 1.0  # MaxRL: M - 1 = 7 at p = 0 (M 8)


def test_a_cell_that_was_never_shipped_is_one_line(capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["countdown3-softmax-seed12"] if not reproduce.shipped("countdown3-softmax-seed12")
                       else ["no-such-cell"])
    assert "error:" in capsys.readouterr().err


def write_rows(path, rows):
    reproduce.write_results(str(path), rows)


def test_each_cpu_keeps_its_own_shipped_rows(tmp_path, monkeypatch):
    # two CPUs train two trajectories from one seed: shipping from one never replaces the other's row
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    made = {"commit": "abc", "date": "d", "load": "0"}
    reproduce.ship("default", {"after_pass@1": 0.6}, {**made, "machine": "Intel Xeon, avx512, 2 cores"})
    reproduce.ship("default", {"after_pass@1": 0.57}, {**made, "machine": "AMD EPYC, avx512, 2 cores"})
    reproduce.ship("default", {"after_pass@1": 0.58}, {**made, "machine": "AMD EPYC, avx512, 4 cores"})  # re-shipped
    assert len(reproduce.shipped_rows("default")) == 2
    assert reproduce.shipped("default", "AMD EPYC, avx512, 2 cores")["after_pass@1"]["value"] == "0.58"
    assert reproduce.shipped("default", "Intel Xeon, avx512, 16 cores")["after_pass@1"]["value"] == "0.6"
    assert reproduce.shipped("default", "Some ARM, aarch64, 8 cores")  # none of its own: another CPU's rows
    # issue 82 (U2): a pinned cell shipped from an AVX2-only CPU kept the AVX-512 one's rows of the same path
    monkeypatch.setattr(reproduce, "this_machine", lambda: "AMD EPYC, avx512, 2 cores")
    reproduce.ship("smoke-avx2", {"after_pass@1": 0.25}, {**made, "machine": "AMD EPYC, avx512, 2 cores"})
    reproduce.ship("smoke-avx2", {"after_pass@1": 0.5}, {**made, "machine": "AMD EPYC, avx2, 2 cores"})
    reproduce.ship("smoke-avx2", {"after_pass@1": 0.3}, {**made, "machine": "AMD EPYC, avx2, 2 cores"})
    assert sorted(row["value"] for row in reproduce.shipped_rows("smoke-avx2")) == ["0.25", "0.3"]
    assert reproduce.shipped("smoke-avx2")["after_pass@1"]["value"] == "0.25"  # this CPU kind's, on its path
    assert reproduce.shipped_values("smoke-avx2") == {"after_pass@1": 0.25}
    assert reproduce.shipped_values("smoke-avx2", "AMD EPYC, avx2") == {"after_pass@1": 0.3}


def test_the_headline_reads_its_shipped_seeds_and_computes_the_power(tmp_path, monkeypatch, capsys):
    # three paired seeds by hand: differences +0.02, +0.04, +0.06 -> mean +0.04, SD 0.02, SE 0.02 / sqrt(3);
    # 95% interval 0.04 +- 4.3027 * 0.011547 = [-0.0097, +0.0897]; seeds for a +-0.03 half-width at SD 0.02: 5
    # (4 seeds: t_{.975,3} 3.1824 * 0.02 / 2 = 0.0318 > 0.03; 5 seeds: t_{.975,4} 2.7764 * 0.02 / sqrt 5 = 0.0248)
    machine = "Test CPU, avx2, 2 cores"
    rows = []
    for seed, (grpo, softmax) in enumerate([(0.10, 0.12), (0.15, 0.19), (0.20, 0.26)]):
        for method, value in (("grpo", grpo), ("softmax", softmax)):
            rows.append({"cell": f"countdown3-{method}-seed{seed}", "metric": "after_pass@1", "value": value,
                         "commit": "abc", "date": "d", "load": "0", "machine": machine, "command": "c"})
    write_rows(tmp_path / "countdown3_runs.csv", rows)
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    by_seed = headline.main(["--machine", "Test CPU", "--figure", str(tmp_path / "h.png")])
    assert list(by_seed["grpo"]) == [0, 1, 2]
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("| greedy pass@1"))
    assert "+0.040 [-0.010, +0.090] none resolved" in line and "SD 0.020" in line and "seeds for ±0.03: 5" in line
    assert "Table 3 (each trained policy): not shipped" in out
    with pytest.raises(SystemExit):
        headline.main(["--machine", "No such CPU"])
    # no machine named: this CPU's rows where it has them, else one line naming the CPUs that shipped some
    for variable in ("ATEN_CPU_CAPABILITY", "MKL_CBWR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(reproduce, "this_machine", lambda: machine)
    assert list(headline.main(["--figure", str(tmp_path / "h.png")])["grpo"]) == [0, 1, 2]
    monkeypatch.setattr(reproduce, "this_machine", lambda: "Other CPU, avx512, 2 cores")
    with pytest.raises(SystemExit) as stop:
        headline.main([])
    assert str(stop.value) == ("lab.headline: error: no countdown3 seed of both methods was shipped from this CPU "
                               "(Other CPU, avx512); from Test CPU, avx2 (--machine NAME reads one)")


def test_a_compare_folder_ships_only_runs_that_name_their_code(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path / "results"))
    folder, run_dir = tmp_path / "cmp", tmp_path / "cmp" / "countdown3" / "grpo-seed3"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    fields = ["config", "seed", "before_pass@1", "after_pass@1", "sampled_pass@8", "output_dir"]
    with open(folder / "countdown3_runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerow({"config": "grpo", "seed": 3, "before_pass@1": 0.05, "after_pass@1": 0.13,
                         "sampled_pass@8": 0.15, "output_dir": str(run_dir)})
    with open(folder / "countdown3_table3.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["config", "seed", "bin", "prompts", "share_grpo_advantages",
                                               "share_softmax_advantages"])
        writer.writeheader()
        writer.writerow({"config": "grpo", "seed": 3, "bin": "[0,.1)", "prompts": 200, "share_grpo_advantages": 0.1,
                         "share_softmax_advantages": 0.3})
    with pytest.raises(SystemExit, match="code.json"):  # which code trained it is not known: not shipped
        reproduce.main(["--ship-from", str(folder)])
    (run_dir / "code.json").write_text(json.dumps({"commit": "a" * 40}))
    assert reproduce.main(["--ship-from", str(folder), "--load", "1-2"]) == 0
    rows = reproduce.shipped("countdown3-grpo-seed3")
    assert {key: float(row["value"]) for key, row in rows.items()} == {
        "before_pass@1": 0.05, "after_pass@1": 0.13, "sampled_pass@8": 0.15, "table3_prompts_[0,.1)": 200,
        "table3_share_grpo_adv_[0,.1)": 0.1, "table3_share_softmax_adv_[0,.1)": 0.3}
    assert {row["commit"] for row in rows.values()} == {"aaaaaaa"} and rows["after_pass@1"]["load"] == "1-2"


def test_the_tuning_grid_ships_one_cell_per_run_and_names_compares_grid():
    from lab import compare  # imports torch; reproduce stays light, so its copy of the names is tied here
    assert reproduce.TUNING_CONFIGS == list(compare.PRESETS["countdown3-tuning"]["configs"])
    assert len([name for name in reproduce.CELLS if name.startswith("countdown3-tuning-")]) == 15 * 3


def test_a_tuning_folder_ships_as_its_presets_cells_and_two_presets_need_one_named(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path / "results"))
    folder, run_dir = tmp_path / "grid", tmp_path / "grid" / "countdown3-tuning" / "softmax-M4-tau0.3-seed1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    (run_dir / "code.json").write_text(json.dumps({"commit": "b" * 40}))
    with open(folder / "countdown3-tuning_runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["config", "seed", "after_pass@1", "sampled_pass@16", "output_dir"])
        writer.writeheader()
        writer.writerow({"config": "softmax-M4-tau0.3", "seed": 1, "after_pass@1": 0.17, "sampled_pass@16": 0.31,
                         "output_dir": str(run_dir)})
    assert reproduce.ship_from(str(folder), "2") == ["countdown3-tuning-softmax-M4-tau0.3-seed1"]
    rows = reproduce.shipped("countdown3-tuning-softmax-M4-tau0.3-seed1")
    assert {key: float(row["value"]) for key, row in rows.items()} == {"after_pass@1": 0.17, "sampled_pass@16": 0.31}
    assert os.path.isfile(tmp_path / "results" / "referee_tuning_runs.csv")
    (folder / "countdown3_runs.csv").write_text("config,seed\n")
    with pytest.raises(SystemExit, match="runs of 2 presets .countdown3, countdown3-tuning.; name one with --preset"):
        reproduce.ship_from(str(folder), "2")
    assert reproduce.ship_from(str(folder), "2", "countdown3-tuning") == ["countdown3-tuning-softmax-M4-tau0.3-seed1"]


def test_a_lopti_comparison_grpo_cell_carries_its_seeds_fig3_rows(tmp_path):
    (tmp_path / "countdown3-lopti_fig3").mkdir()
    with open(tmp_path / "countdown3-lopti_runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["config", "seed", "after_pass@1", "output_dir"])
        writer.writeheader()
        writer.writerows([{"config": config, "seed": 2, "after_pass@1": 0.15, "output_dir": "x"}
                          for config in ("grpo", "lopti")])
    with open(tmp_path / "countdown3-lopti_fig3" / "fig3_prob_rise.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["seed", "method", "group", "pos_rose_share", "neg_fell_share"])
        writer.writeheader()
        writer.writerows([{"seed": seed, "method": "lopti", "group": 4, "pos_rose_share": share,
                           "neg_fell_share": "nan" if seed == 2 else 0.5} for seed, share in ((2, 0.61), (3, 0.9))])
    assert reproduce.compare_metrics(str(tmp_path), "countdown3-lopti", "grpo", 2) == {
        "after_pass@1": 0.15, "fig3_lopti_Q4_pos_rose_share": 0.61}  # nan (no A < 0 token there): not a metric
    assert reproduce.compare_metrics(str(tmp_path), "countdown3-lopti", "lopti", 2) == {"after_pass@1": 0.15}


def test_a_clipping_cell_summarizes_the_clip_and_kl_activity_by_hand(tmp_path):
    rows = [{"step": step, "clip_frac_low": low, "clip_frac_high": high, "ratio_mean": 1.0, "ratio_max": top,
             "kl": kl} for step, low, high, top, kl in ((1, 0.0, 0.0, 1.0, 0.0), (50, 0.2, 0.0, 3.5, 0.25),
                                                       (150, 0.1, 0.3, 1.0, 0.5))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows)
                                            + json.dumps({"step": 150, "eval": True, "pass@1": 0.2}) + "\n")
    assert reproduce.clip_activity(str(tmp_path)) == {
        "clip_frac_low_mean": 0.1, "clip_frac_high_mean": 0.1, "ratio_max": 3.5, "ratio_exactly_one": 0.0,
        "kl_step50": 0.25, "kl_step150": 0.5}


def test_a_presets_summary_pairs_its_shipped_cells_by_seed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    made = {"commit": "c", "date": "d", "load": "1", "machine": "CPU A, avx512, 2 cores"}
    for seed, (grpo, softmax) in enumerate([(0.50, 0.55), (0.60, 0.61), (0.70, 0.78)]):
        reproduce.ship(f"countdown-grpo-seed{seed}", {"after_pass@1": grpo}, made)
        reproduce.ship(f"countdown-softmax-seed{seed}", {"after_pass@1": softmax}, made)
    runs = summary.summary("countdown", "CPU A")
    assert runs["softmax"] == {0: {"after_pass@1": 0.55}, 1: {"after_pass@1": 0.61}, 2: {"after_pass@1": 0.78}}
    out = capsys.readouterr().out
    assert "| grpo (3) | 0.600 +- 0.058 |" in out  # mean 0.6, SE 0.1 / sqrt(3)
    assert "softmax − grpo, paired by seed, n = 3" in out and "after_pass@1 +0.047 [" in out and "(holds 0)" in out
    with pytest.raises(SystemExit, match="no cell of countdown was shipped from a CPU named 'CPU B'"):
        summary.summary("countdown", "CPU B")


def test_fig3_over_seeds_from_the_grpo_cells_by_hand(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    made = {"commit": "c", "date": "d", "load": "1", "machine": "CPU A, avx512, 2 cores"}
    for seed, (grpo, lopti) in enumerate([(0.7, 0.6), (0.5, 0.3)]):
        reproduce.ship(f"countdown3-lopti-grpo-seed{seed}", {"after_pass@1": 0.1, **{
            f"fig3_{m}_Q{q}_pos_rose_share": share for m, share in (("grpo", grpo), ("lopti", lopti))
            for q in range(1, 5)}}, made)
    summary.summary("countdown3-lopti", "CPU A", figure=str(tmp_path / "fig3.png"))
    out = capsys.readouterr().out
    assert "n = 2 seeds" in out and "| grpo | 0.60 ± 0.14 |" in out and "| lopti | 0.45 ± 0.21 |" in out
    assert "lopti − grpo: Q1 -0.150 ± 0.050" in out  # differences -0.1 and -0.2: mean -0.15, SE 0.05
    assert (tmp_path / "fig3.png").exists() or "matplotlib" in out


def test_a_changed_results_file_does_not_mark_the_code_dirty_but_a_changed_python_file_does(tmp_path, monkeypatch):
    from experiments import runs
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cells.csv").write_text("a\n")
    (tmp_path / "step.py").write_text("x = 1\n")
    for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run(["git", *args], cwd=tmp_path, check=True)
    monkeypatch.setattr(runs, "REPO", str(tmp_path))
    (tmp_path / "docs" / "cells.csv").write_text("a\nb\n")  # what a --ship just wrote
    assert not reproduce.provenance()["commit"].endswith("-dirty")
    (tmp_path / "step.py").write_text("x = 2\n")
    assert reproduce.provenance()["commit"].endswith("-dirty")


def test_the_eq4_cell_counts_the_intervals_that_hold_the_exact_weight():
    rows = [{"M": "8", "tau": "0.1", "p": str(p), "mc_mean": str(mean), "z": str(z)}
            for p, mean, z in ((0.1, 5.2, -0.5), (0.5, 2.0, 1.96), (0.9, 1.1, -2.3), (0.3, 3.0, 0.1))]
    metrics = reproduce.eq4_metrics(rows)
    assert metrics == {"M8_tau0.1_max_abs_z": 2.3, "M8_tau0.1_intervals_holding": 3.0,  # |z| <= 1.96 holds
                       "M8_tau0.1_mc_mean_p0.1": 5.2, "M8_tau0.1_mc_mean_p0.5": 2.0, "M8_tau0.1_mc_mean_p0.9": 1.1}


def test_a_timing_ratio_agrees_within_its_tolerance_and_an_exact_metric_only_when_equal():
    assert reproduce.tolerance("step-time-tiny-cpu", "one_pass_over_trl") == 0.2
    assert reproduce.tolerance("step-time-smollm2-cpu", "lopti_over_one_pass") == 0.2
    assert reproduce.tolerance("step-time-tiny-cpu", "lopti_no_grad_forwards_over_floor") == 0.4
    assert reproduce.tolerance("default", "after_pass@1") == 0.0
    assert reproduce.agrees(0.35, 0.41, 0.2) and reproduce.agrees(0.35, 0.29, 0.2)  # +17%, -17%
    assert not reproduce.agrees(0.35, 0.43, 0.2) and not reproduce.agrees(0.35, 0.27, 0.2)  # +23%, -23%
    assert reproduce.agrees(0.57, 0.57, 0.0) and not reproduce.agrees(0.57, 0.5700001, 0.0)


def test_a_timing_cell_reproduces_within_its_tolerance_and_records_the_load_at_its_start(tmp_path, monkeypatch,
                                                                                          capsys):
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    made = {"commit": "abc", "date": "d", "load": "0.1 0.1 0.1", "machine": reproduce.this_machine()}
    reproduce.ship("step-time-tiny-cpu", {"one_pass_over_trl": 0.35, "one_pass_step_over_floor": 6.5}, made)
    reruns = iter([{"one_pass_over_trl": 0.4, "one_pass_step_over_floor": 8.5},  # +14%, +31%: within 20%, 40%
                   {"one_pass_over_trl": 0.3, "one_pass_step_over_floor": 9.5},  # -14%, +46%: the floor's outside
                   {"one_pass_step_over_floor": 6.5}])  # TRL not installed: its ratio not measured
    monkeypatch.setattr(reproduce, "rerun", lambda name, folder, extra=None: next(reruns))
    assert reproduce.main(["step-time-tiny-cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "step-time-tiny-cpu one_pass_over_trl shipped 0.35 now 0.4 (tolerance ±20%: within)" in out
    assert "step-time-tiny-cpu one_pass_step_over_floor shipped 6.5 now 8.5 (tolerance ±40%: within)" in out
    assert out[-1] == "reproduced: step-time-tiny-cpu"
    assert reproduce.main(["step-time-tiny-cpu"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "step-time-tiny-cpu one_pass_step_over_floor shipped 6.5 now 9.5 (tolerance ±40%: outside) difference +3" \
        in out
    assert out[-2:] == ["1 of 2 numbers differ; the largest difference 3 (one_pass_step_over_floor)",
                        "differs: step-time-tiny-cpu"]
    monkeypatch.setattr(reproduce, "load_average", iter(["1.50 1.00 0.50", "2.50 1.20 0.60"]).__next__)
    assert reproduce.main(["step-time-tiny-cpu", "--ship"]) == 0
    assert "shipped 0.35 now none (tolerance ±20%: outside)" in capsys.readouterr().out
    rows = reproduce.shipped("step-time-tiny-cpu")
    assert list(rows) == ["one_pass_step_over_floor"]
    assert rows["one_pass_step_over_floor"]["load"] == "1.50 1.00 0.50 at start, 2.50 1.20 0.60 at end"


def test_a_timing_cells_metrics_are_step_times_ratios_by_hand():
    def phase(ratio, part=False):
        return {"measured_s": 1.0, "floor_s": 0.5, "ratio": ratio, "bound": "", "part": part}
    numbers = {"sides": {"one_pass": {"phases": {"rollout": phase(6.8123), "decode": phase(5.2, part=True),
                                                 "reward+advantage": phase(None), "step": phase(6.5)}},
                         "lopti": {"phases": {"no-grad forwards": phase(9.9), "step": phase(7.5)}},
                         "trl": {"s_per_step": 0.785}},
               "ratios": {"one_pass_over_trl": 0.30446, "one_pass_step_over_floor": 6.5}}
    assert reproduce.timing_metrics(numbers) == {
        "lopti_no_grad_forwards_over_floor": 9.9, "lopti_step_over_floor": 7.5, "one_pass_over_trl": 0.304,
        "one_pass_rollout_over_floor": 6.812, "one_pass_step_over_floor": 6.5}  # not a part, nor a phase sans floor


def test_step_time_writes_its_numbers_and_without_trl_leaves_trls_ratios_out(tmp_path, monkeypatch, one_thread):
    """The cheapest step_time run (tests/test_benchmarks.py's), TRL taken as not installed: the file a timing cell
    reads, its two sides' phases against their floors, no TRL side or ratio, and the reason written down."""
    from benchmarks import step_time
    from tests.test_benchmarks import CHEAP_STEP_TIME
    monkeypatch.setattr(step_time, "trl_installed", lambda: False)
    step_time.main([*CHEAP_STEP_TIME, "--json", str(tmp_path / "step.json")])
    numbers = json.loads((tmp_path / "step.json").read_text())
    assert numbers["trl_skipped"] == step_time.NO_TRL and set(numbers["sides"]) == {"one_pass", "lopti"}
    assert numbers["peaks"] == {"tflops": 0.05, "gbps": 5.0, "source": "given"}
    one_pass = numbers["sides"]["one_pass"]
    assert list(one_pass["phases"])[-1] == "step" and one_pass["phases"]["decode"]["part"]
    step = one_pass["phases"]["step"]
    assert step["ratio"] == pytest.approx(step["measured_s"] / step["floor_s"]) and step["ratio"] > 1
    assert set(numbers["ratios"]) == {"one_pass_step_over_floor", "lopti_step_over_floor", "lopti_over_one_pass"}
    assert numbers["ratios"]["lopti_over_one_pass"] == pytest.approx(
        numbers["sides"]["lopti"]["s_per_step"] / one_pass["s_per_step"])
    metrics = reproduce.timing_metrics(numbers)
    assert {"one_pass_rollout_over_floor", "lopti_step_over_floor"} <= metrics.keys()
    assert not any("trl" in metric for metric in metrics)
    assert all(reproduce.tolerance("step-time-tiny-cpu", metric) > 0 for metric in metrics)


@pytest.mark.slow
def test_the_smoke_cell_reproduces_from_scratch():
    # a 4-step tiny run with its own warm start, on the AVX2 code path: the shipped numbers, exactly (docs/tests.md)
    here = reproduce.cpu_kind(reproduce.this_machine())
    if not any(reproduce.cpu_kind(row["machine"]) == here for row in reproduce.shipped_rows("smoke-avx2")):
        pytest.skip(f"smoke-avx2 was never shipped from this CPU ({here}): each CPU has its own trajectory")
    proc = subprocess.run([sys.executable, "-m", "lab.reproduce", "smoke-avx2"], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "reproduced: smoke-avx2", \
        proc.stdout + proc.stderr[-2000:]


# --- which code path a rerun takes (lab/ledger.py code_path, can_run; reproduce.choose_pin) -------------------------
def test_a_code_path_is_the_cpu_model_and_the_isa_a_pin_sets():
    from lab import ledger
    assert ledger.code_path("AMD EPYC, avx512, 2 cores") == "AMD EPYC, avx512"
    assert ledger.code_path("AMD EPYC, avx512, 2 cores", "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 python x") == \
        "AMD EPYC, avx2"
    assert ledger.can_run("AMD EPYC, avx512, 2 cores", "AMD EPYC, avx2")  # a wider ISA runs a narrower path
    assert not ledger.can_run("AMD EPYC, avx2, 2 cores", "AMD EPYC, avx512")  # not the other way
    assert not ledger.can_run("Intel(R) Xeon(R) Processor, avx512, 2 cores", "AMD EPYC, avx2")  # nor another CPU
    assert ledger.pin_for("AMD EPYC, avx2") == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


@pytest.mark.parametrize("here, shipped_from, pin", [
    ("AMD EPYC, avx512, 2 cores", "AMD EPYC, avx2, 2 cores", {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}),
    ("AMD EPYC, avx2, 2 cores", "AMD EPYC, avx2, 4 cores", {}),  # its own path has rows: nothing to pin
    ("AMD EPYC, avx2, 2 cores", "AMD EPYC, avx512, 2 cores", {}),  # cannot take a wider path
    ("Intel(R) Xeon(R) Processor, avx512, 2 cores", "AMD EPYC, avx2, 2 cores", {})])  # another vendor
def test_a_rerun_pins_this_cpu_onto_a_path_whose_rows_exist_where_it_can(tmp_path, monkeypatch, capsys, here,
                                                                       shipped_from, pin):
    from lab import ledger
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    for variable in ledger.PINS:
        monkeypatch.delenv(variable, raising=False)
    reproduce.ship("table3-identity", {"ratio_k1": 1.0}, {"commit": "abc", "date": "d", "load": "0",
                                                         "machine": shipped_from})
    monkeypatch.setattr(reproduce, "this_machine", lambda: here)
    assert reproduce.choose_pin("table3-identity") == pin
    seen = {}
    monkeypatch.setattr(reproduce, "rerun", lambda name, folder, extra=None: seen.update(extra=extra) or
                        {"ratio_k1": 1.0})
    assert reproduce.main(["table3-identity"]) == 0
    assert seen["extra"] == pin  # the rerun ran on the path it named
    out = capsys.readouterr().out
    assert ("has no rows of this CPU's own code path" in out) == bool(pin)
    assert ("nor on one it can take" in out) == (not pin and shipped_from.rsplit(",", 1)[0] != here.rsplit(",", 1)[0])


# --- where a row reruns: at HEAD, or at its commit where the step's numerics changed since (lab/numerics.csv) ------
def git_or_skip(*commits):
    from experiments.runs import git
    if not all(git("rev-parse", "--verify", "-q", f"{commit}^{{commit}}") for commit in commits):
        pytest.skip(f"this checkout has no git history of {', '.join(commits)}")
    return git


def ship_default_at(commit, machine="AMD EPYC, avx2, 2 cores"):
    reproduce.ship("default", {"before_pass@1": 0.15, "after_pass@1": 0.59},
                   {"commit": commit, "date": "d", "load": "0", "machine": machine})


def test_the_numerics_table_names_commits_of_heads_history_each_with_what_changed():
    git = git_or_skip("200e2ee")
    rows = reproduce.numerics_since(git("rev-list", "--max-parents=0", "HEAD").split()[0])  # since the first commit
    assert "200e2ee" in [row["commit"] for row in rows]  # the update that accumulates exactly
    for row in rows:
        full = git("rev-parse", "--verify", "-q", row["commit"] + "^{commit}")
        assert full and git("merge-base", full, "HEAD") == full and row["change"], row


@pytest.mark.parametrize("commit, since", [("f80a5bd", ["200e2ee"]), ("200e2ee", []), ("e6a293c", ["200e2ee"]),
                                           ("9824049", ["200e2ee"])])
def test_list_says_whether_head_reproduces_a_row_from_the_numerics_changes_since_its_commit(
        tmp_path, monkeypatch, capsys, commit, since):
    git_or_skip(commit, "200e2ee")
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    monkeypatch.setattr(reproduce, "this_machine", lambda: "AMD EPYC, avx2, 2 cores")
    ship_default_at(commit)
    assert [row["commit"] for row in reproduce.numerics_since(commit)] == since
    assert reproduce.head_reproduces("table3-identity", commit) == ""  # a formula: no step, no numerics
    assert reproduce.head_reproduces("imagenet-toy", commit) == ""  # its own update: 200e2ee touched none of it
    assert reproduce.numerics_since("0000000") is None  # git cannot tell
    reproduce.main(["--list"])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("default "))
    assert (f"reruns at {commit} (numerics changed at 200e2ee)" in line) == bool(since), line


@pytest.mark.parametrize("flags", [[], ["--at-head"]])
def test_a_row_made_before_a_numerics_change_reruns_in_a_worktree_at_its_commit(tmp_path, monkeypatch, capsys,
                                                                              flags):
    # the rerun's processes run in a git worktree of the row's commit (removed after); --at-head keeps HEAD
    git = git_or_skip("f80a5bd", "200e2ee")
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    monkeypatch.setattr(reproduce, "this_machine", lambda: "AMD EPYC, avx2, 2 cores")
    for variable in ("ATEN_CPU_CAPABILITY", "MKL_CBWR"):
        monkeypatch.delenv(variable, raising=False)
    ship_default_at("f80a5bd")
    seen = {}

    def rerun(name, folder, extra=None):
        code = reproduce.PROGRESS.get("code", reproduce.REPO)
        seen.update(code=code, commit=subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=code,
                                                     capture_output=True, text=True).stdout.strip())
        return {"before_pass@1": 0.15, "after_pass@1": 0.59}
    monkeypatch.setattr(reproduce, "rerun", rerun)
    assert reproduce.main(["default", *flags]) == 0
    out = capsys.readouterr().out
    assert "the step's numerics changed since f80a5bd" in out and "200e2ee, the update that accumulates exactly" in out
    if flags:
        assert seen["code"] == reproduce.REPO and "rerunning at HEAD as asked" in out
    else:
        assert seen["commit"] == "f80a5bd" and seen["code"] != reproduce.REPO
        assert not os.path.exists(seen["code"]) and seen["code"] not in git("worktree", "list")  # removed after
    assert "code" not in reproduce.PROGRESS


@pytest.mark.parametrize("here, there, words", [
    ("AMD EPYC, avx2", "AMD EPYC, avx512", "another instruction set"),
    ("Intel(R) Xeon(R) Processor, avx512", "AMD EPYC, avx512", "another vendor"),
    ("Intel(R) Xeon(R) Processor, avx2", "AMD EPYC, avx512", "another vendor and instruction set"),
    ("AMD EPYC 9654, avx512", "AMD EPYC, avx512", "another CPU model")])
def test_the_note_names_what_differs_between_two_code_paths(here, there, words):
    assert reproduce.what_differs(here, there) == words


def test_a_lab_module_the_old_code_lacks_runs_as_its_experiments_module(tmp_path, monkeypatch):
    # before ebc7f6b the lab lived in experiments/: a rerun at such a commit names the module as it was then
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "__init__.py").write_text("")
    (tmp_path / "experiments" / "compare.py").write_text("import sys; sys.exit(0 if sys.argv[1:] == ['x'] else 3)")
    monkeypatch.setitem(reproduce.PROGRESS, "code", str(tmp_path))
    reproduce.run_quietly([sys.executable, "-m", "lab.compare", "x"], dict(os.environ))  # exits 0 there
