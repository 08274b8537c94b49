"""The benchmark scripts run: the GPU check's shell script parses and answers --help, and its random-model step
runs on a CPU at a tiny shape (the GPU numbers themselves come from benchmarks/gpu_check.sh on a GPU)."""
import os
import subprocess

import pytest

from benchmarks import random_model_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_script_parses_and_answers_help():
    script = os.path.join(REPO, "benchmarks", "gpu_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    proc = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "Qwen2.5-0.5B" in proc.stdout


@pytest.mark.parametrize("extra", [[], ["--lopti"]])
def test_random_model_step_on_a_cpu(capsys, extra):
    random_model_step.main(["--shape", "test", "--device", "cpu", "--steps", "1", "--prompts", "2", "-M", "2",
                            "--max-new-tokens", "4", *extra])
    result = [line for line in capsys.readouterr().out.splitlines() if line.startswith("RESULT")]
    assert len(result) == 1 and "s/step" in result[0] and "peak RSS" in result[0]
