"""A flag, a device or a setting that cannot work is one line with exit code 2, before torch loads where it can be;
--help names every flag with its default; --dtype auto picks what the card has."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from harness import config, flags as flags_module
from tests.run_cli import fails, finished_run, run  # noqa: F401 (finished_run: a fixture)
from tests.stubs import SMALL_TRAIN as SMALL


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("digits_task")


# --- 9. one line, the right code, at the right time -----------------------------------------------------------------
@pytest.mark.parametrize("flags,message", [
    (["--seed", "-1"], "--seed must lie in"),
    (["--seed", str(10**20)], "--seed must lie in"),
    (["--lopti-eta", "1.5"], "--lopti-eta must lie in [0, 1]"),
    (["--warm-start-target", "5"], "--warm-start-target must lie in [0, 1]"),
    (["--clip-high", "0"], "--clip-high must be > 0"),
    (["--kl-coef", "nan"], "argument --kl-coef: expected a finite number"),
    # numbers that ran into a traceback mid-run (nan weights) or built a model RoPE cannot rotate
    (["--kl-coef", "1e30"], "--kl-coef must lie in [0, 100]"),
    (["--lr", "1e30"], "--lr must lie in (0, 1]"),
    (["--weight-decay", "1e30"], "--lr x --weight-decay must be <= 1"),
    (["--temperature", "1e-300"], "--temperature must be >= 0.001"),
    (["--tiny-hidden", "12"], "--tiny-hidden must be a multiple of 8 from 8 to 4096"),
    (["--tiny-hidden", "4"], "--tiny-hidden must be a multiple of 8 from 8 to 4096"),
    (["--tiny-hidden", str(10**6)], "--tiny-hidden must be a multiple of 8 from 8 to 4096"),
    (["--prompts-per-step", str(10**9)], "--prompts-per-step must lie in [1, 1048576]"),
    (["--num-generations", str(10**9)], "--num-generations must be <= 65536"),
    (["--max-new-tokens", str(10**9)], "--max-new-tokens must lie in [1, 1048576]"),
    (["--eval-size", str(10**9)], "--eval-size must lie in [1, 1048576]"),
    (["--lora-rank", str(10**9)], "--lora-rank must lie in [0, 65536]"),
    (["--tiny-layers", str(10**6)], "--tiny-layers must lie in [1, 64]"),
    (["--task", "gsm8k"], "--task gsm8k needs --data"),
])
def test_flags_are_checked_before_torch_loads(tmp_path, flags, message):
    code = ("import sys; from harness import flags\ntry:\n    flags.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    proc = subprocess.run([sys.executable, "-c", code, "--output-dir", str(tmp_path), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "2"] and proc.stderr.startswith("train.py: error:")
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


FLOAT_FLAGS = [flags_module.flag_name(f.name) for f in config.dataclasses.fields(config.Config)
               if f.metadata.get("flag", True) and config.field_kind(f)[0] is float]


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
def test_a_float_flag_beyond_float32s_range_is_one_line(capsys, flag):
    # 2c9f269: --clip-high 1e308 and --kl-clamp 1e308 passed the dry run, then step 1 ended in a RuntimeError
    # traceback (ppo.py: "value cannot be converted to type float without overflow"); 3.4e38 is float32's largest
    if flag == "--reward-timeout":  # seconds, never a tensor: a value so large is no limit
        assert flags_module.parse_args([flag, "1e300"]).reward_timeout == 1e300
        return
    for value in ("1e308", "-1e39"):
        err = fails(capsys, ["--dry-run", f"{flag}={value}"], code=2)
        assert f"argument {flag}: expected a finite number within float32's range" in err
    assert len(FLOAT_FLAGS) >= 15


def test_a_conflicting_resume_flag_is_exit_1_before_torch_loads(finished_run):
    path = os.path.join(finished_run, "checkpoint-4", "run.json")  # a built-in task: "digits" is this process's own
    json.dump({**json.load(open(path)), "task": "countdown"}, open(path, "w"))
    code = ("import sys; from harness import flags\ntry:\n    flags.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    proc = subprocess.run([sys.executable, "-c", code, "--resume", finished_run, "--method", "grpo"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "1"] and "--method grpo conflicts" in proc.stderr


def test_cuda_on_a_cpu_torch_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = fails(capsys, ["--output-dir", str(tmp_path / "run"), "--device", "cuda", "--steps", "0"], code=2)
    assert "--device cuda: this torch sees no CUDA device" in err


def test_every_flag_appears_in_help_with_its_default():
    text = " ".join(flags_module.build_parser().format_help().split())
    for name in ("--output-dir", "--seed", "--clip-low", "--overwrite", "--resume"):
        assert name in text
    assert "(default: runs/default)" in text and "(default: 0.2; paper: 0.2)" in text


@pytest.mark.parametrize("has_bf16,expected", [(True, "bf16"), (False, "fp32")], ids=["A100-like", "T4-like"])
def test_dtype_auto_picks_bf16_only_where_the_card_has_it(monkeypatch, capsys, has_bf16, expected):
    from harness import settle
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a faked card on this CPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: has_bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Tesla T4")
    settled = settle.hardware(config.Config())
    assert (settled.device, settled.dtype) == ("cuda", expected)
    assert ("Tesla T4 has no bf16: --dtype auto computes in fp32" in capsys.readouterr().out) == (not has_bf16)
    assert settle.hardware(config.Config(dtype="bf16")).dtype == "bf16"  # asked for: kept


def test_every_switch_is_off_by_default_and_its_flag_turns_it_on():
    assert all(f.default is False for f in config.dataclasses.fields(config.Config) if config.field_kind(f)[0] is bool)
    text = " ".join(flags_module.build_parser().format_help().split())
    assert "(default: True)" not in text and flags_module.parse_args(["--fast-generate"]).fast_generate is True
    assert re.search(r"--gradient-checkpointing [^-]*\(default: off", text) and "(default: False)" not in text


def test_a_missing_model_or_unreachable_hub_id_answers_before_torch_loads(tmp_path):
    code = ("import sys; from harness import flags\ntry:\n    flags.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    for model, message in [("./no/such/model", "model path does not exist"),
                           ("no-such-org/no-such-model", "not in the Hugging Face cache")]:
        proc = subprocess.run([sys.executable, "-c", code, "--output-dir", str(tmp_path), "--model", model], cwd=REPO,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")})
        assert proc.stdout.split() == ["False", "2"] and message in proc.stderr


def test_the_settings_line_names_ar_and_lopti(tmp_path, capsys):
    run(tmp_path / "run", "--steps", "1", "--alpha", "0.3", "--lopti-eta", "0.5")
    assert "method softmax, AR alpha 0.3, Lopti eta 0.5 (low-first), lr" in capsys.readouterr().out


# --- the right message (issue 61) --------------------------------------------------------------------------------
@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry-run"])
def test_device_mps_without_mps_is_one_line(tmp_path, capsys, dry_run):
    # a traceback from the first .to("mps"), and --dry-run accepted it
    err = fails(capsys, ["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL, "--device", "mps",
                         *dry_run], code=2)
    assert "--device mps: this torch sees no MPS device" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_inspect_step_with_a_device_this_machine_lacks_exits_2_as_a_flag_error(finished_run, capsys):
    from experiments import inspect_step
    with pytest.raises(SystemExit) as exit_info:
        inspect_step.main([finished_run, "--device", "cuda"])
    assert exit_info.value.code == 2 and "--device cuda: this torch sees no CUDA device" in capsys.readouterr().err
