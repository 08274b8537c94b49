"""experiments/reproduce.py: a shipped cell rerun from scratch compares equal, and a changed number is reported."""
import csv
import os
import shutil
import subprocess
import sys

import pytest

from experiments import reproduce

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_cell_names_a_results_file_and_a_command(capsys):
    assert reproduce.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in reproduce.CELLS)
    assert "python -m experiments.compare --preset countdown3 --configs softmax --seeds 12" in out
    # item 5's clipped case: the run, then referee_lopti on its checkpoint once per clip setting
    assert reproduce.command_text("lopti-offpolicy-seed0").split("; ", 1) == [
        "OMP_NUM_THREADS=1 python -m experiments.compare --preset countdown3 --configs grpo --seeds 0 "
        "--output-dir RUNS",
        "OMP_NUM_THREADS=1 python -m experiments.referee_lopti --checkpoint RUNS/countdown3/grpo-seed0/latest "
        "--task-option num_count=3 --seeds 0,1,2 --num-prompts 64 (metrics run_clip_*; lopti_clip_*: the same with "
        "--clip-low 0.2 --clip-high 0.24 --dual-clip 10)"]


def test_the_identity_cell_reproduces_and_a_changed_number_differs(tmp_path, monkeypatch, capsys):
    assert reproduce.main(["table3-identity"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "reproduced: table3-identity"
    shutil.copytree(reproduce.RESULTS, tmp_path / "results")
    path = tmp_path / "results" / "table3_identity.csv"
    rows = list(csv.DictReader(open(path, newline="")))
    rows[0]["value"] = str(float(rows[0]["value"]) + 0.001)  # what a stale row would say
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=reproduce.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path / "results"))
    assert reproduce.main(["table3-identity"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "differs: table3-identity" and any(rows[0]["metric"] + " shipped" in line for line in out)


def test_a_cell_that_was_never_shipped_is_one_line(capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["countdown3-softmax-seed12"] if not reproduce.shipped("countdown3-softmax-seed12")
                       else ["no-such-cell"])
    assert "error:" in capsys.readouterr().err


@pytest.mark.slow
def test_the_smoke_cell_reproduces_from_scratch():
    # a 4-step tiny run with its own warm start, on the AVX2 code path: the shipped numbers, exactly (docs/tests.md)
    proc = subprocess.run([sys.executable, "-m", "experiments.reproduce", "smoke-avx2"], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "reproduced: smoke-avx2", \
        proc.stdout + proc.stderr[-2000:]
