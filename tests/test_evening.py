"""An evening on one 24 GB card (issue 80): the README's table is what --dry-run prints for each of its commands,
each fits by the plan's own rule; a crash costs minutes (--save-minutes), an out-of-memory error is one line naming
the setting to lower and the --resume command; the host's memory for offloaded states is checked before step 1."""
import dataclasses
import os
import re
import shlex

import pytest
import torch

from harness import flags, memory, run, settle
from harness.config import Config
from harness.files import RunError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARD, BUDGET = "RTX 4090", 24e9  # the table's card; the budget its rows fit (memory.needed)


def evening_rows():
    """The README's evening table -> [(argv, {column: number})]: the header's command + a row's flags, or a
    recipe's own flags + the row's (a cell starting with `bash recipes/<name>.sh`)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    table = text[text.index("| `python train.py --task countdown --device cuda` +"):].split("\n\n")[0].splitlines()
    prefix = shlex.split(table[0].split("`")[1])[2:]
    rows = []
    for line in table[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        words = shlex.split(cells[0].split("`")[1])
        if words[0] == "bash":
            script = open(os.path.join(ROOT, words[1])).read()
            words = shlex.split(script[script.index("args=(") + 6:script.index("\n)")], comments=True) + words[2:] \
                + ["--device", "cuda"]
        else:
            words = prefix + words
        numbers = [float(n) for n in re.findall(r"[\d.]+", " ".join(cells[1:5]).replace("~", ""))]
        rows.append((words, dict(zip(("peak", "needs", "seconds", "per_hour", "host", "checkpoint"), numbers))))
    return rows


@pytest.mark.parametrize("argv, typed", evening_rows(), ids=lambda value: " ".join(value[2:6]) if
                         isinstance(value, list) else "")
def test_each_evening_row_is_what_the_dry_run_prints_and_fits_24gb(argv, typed, capsys):
    config = dataclasses.replace(settle.hardware(flags.parse_args([*argv, "--dry-run"])), style="chat")
    settle.print_memory_plan(config)
    printed = capsys.readouterr().err
    peak, needs = re.search(r"peak: ([\d.]+) GB .*; needs ([\d.]+) GB", printed).groups()
    seconds, per_hour = re.search(rf"{CARD} ~([\d.]+) s \((\d+) an hour", printed).groups()
    host = re.search(r"in CPU memory, not in the peak: ([\d.]+) GB", printed)
    checkpoint = re.search(r"a checkpoint on disk: ([\d.]+) GB", printed).group(1)
    assert typed == pytest.approx(dict(peak=round(float(peak), 1), needs=round(float(needs), 1),
                                       seconds=float(seconds), per_hour=float(per_hour),
                                       host=round(float(host.group(1)) if host else 0.0, 1),
                                       checkpoint=round(float(checkpoint), 1)))
    assert float(needs) * 1e9 <= BUDGET  # fits by the plan's rule: what --memory-budget 24GB accepts as it is
    assert config.steps * float(seconds) <= 4.2 * 3600  # an evening: about 4 hours


def test_the_table_has_an_ar_lopti_row_and_the_papers_countdown_shape():
    commands = [" ".join(argv) for argv, _ in evening_rows()]
    assert any("--alpha 0.3 --lopti-eta 0.5" in command for command in commands)
    assert any("--max-new-tokens 256" in command and "rules=softmaxgrpo" in command for command in commands)


def test_a_dry_run_with_a_budget_prints_the_step_time_of_what_it_proposes(capsys):
    config = Config(model="Qwen/Qwen2.5-0.5B-Instruct", task="countdown", device="cuda", dtype="bf16",
                    micro_batch=16, memory_budget="24GB", style="chat")
    settle.print_memory_plan(config)
    printed = capsys.readouterr().err
    micro = int(re.search(r"fits with --micro-batch (\d+) \(", printed).group(1))
    proposed = dataclasses.replace(config, micro_batch=micro)
    seconds = sum(map(max, memory.step_phases(memory.QWEN25["qwen2.5-0.5b"], proposed, 256,
                                              memory.GPU_PEAKS[CARD]).values()))
    assert f"step time with the settings that fit: " in printed and f"{CARD} ~{seconds:.3g} s" in printed


def test_fast_generate_plans_its_static_cache_and_graph_pool_through_the_update():
    """The static cache (rows x the prompt and completion rounded up to 64 positions, the compute dtype) and, on
    CUDA, the graphs' pool (bf16 copies of the fp32 weights: ~1 GB at 0.5B, ~6.2 GB at 3B; the sampling's float32
    temporaries) stay on the model between calls, so the update's peak holds them too."""
    from fast import kv_cache
    assert memory.CACHE_BUCKET == kv_cache.CACHE_BUCKET
    config = Config(model="Qwen/Qwen2.5-0.5B", device="cuda", dtype="bf16", prompts_per_step=16, num_generations=8,
                    max_new_tokens=256, micro_batch=64, eval_size=16)
    shape = memory.QWEN25["qwen2.5-0.5b"]
    plain, fast = (memory.memory_plan(shape, dataclasses.replace(config, fast_generate=on), 32) for on in (0, 1))
    assert fast["static_cache"] == 2 * 2 * 24 * 128 * 128 * 320 and fast["kv_cache"] == 0
    assert fast["graph_pool"] == 2 * shape.parameters() + 16 * shape.vocab * 128
    assert fast["update_peak"] == plain["update_peak"] + fast["static_cache"] + fast["graph_pool"]
    three = memory.memory_plan(memory.QWEN25["qwen2.5-3b"], dataclasses.replace(config, fast_generate=True), 32)
    assert 6.1e9 < three["graph_pool"] - 16 * shape.vocab * 128 < 6.3e9
    on_cpu = memory.memory_plan(shape, dataclasses.replace(config, fast_generate=True, device="cpu", dtype="fp32"), 32)
    assert on_cpu["graph_pool"] == 0 and on_cpu["static_cache"] == 2 * fast["static_cache"]  # fp32, no graphs


def test_fast_generates_decode_is_timed_by_its_own_guess_not_hf_generates():
    config = Config(model="Qwen/Qwen2.5-0.5B", device="cuda", dtype="bf16", prompts_per_step=16, num_generations=8,
                    max_new_tokens=256, micro_batch=64)
    shape, h200 = memory.QWEN25["qwen2.5-0.5b"], memory.GPU_PEAKS["H200"]
    decode = lambda fast: memory.step_phases(shape, dataclasses.replace(config, fast_generate=fast), 32,  # noqa
                                             h200)["decode"][1]
    assert decode(True) == pytest.approx(memory.FAST_DECODE * 256) and decode(False) > 6 * decode(True)
    text = memory.step_time_text(shape, dataclasses.replace(config, fast_generate=True), 32)
    assert "a guess (no GPU has run it)" in text and "a guessed 40%" in text


# --- a crash costs minutes, an out-of-memory error is one line ------------------------------------------------------
def test_a_cuda_run_saves_every_30_minutes_unless_told_and_a_late_step_saves(tmp_path, monkeypatch):
    assert settle.hardware(Config(device="cuda", dry_run=True)).save_minutes == settle.SAVE_MINUTES == 30
    assert settle.hardware(Config(device="cpu")).save_minutes == 0
    assert settle.hardware(Config(device="cuda", save_minutes=5, dry_run=True)).save_minutes == 5
    state = run.RunState(Config(output_dir=str(tmp_path), save_every=50, eval_every=50, steps=100, save_minutes=30))
    saved = []
    monkeypatch.setattr(state, "save", saved.append)
    state.saved_at = run.time.time() - 29 * 60
    state.end_of_step(3)
    state.saved_at = run.time.time() - 31 * 60
    state.end_of_step(4)
    assert saved == [4]


def out_of_memory_line(tmp_path, monkeypatch, phase, saved=(), **settings):
    """The line train.py prints when a stand-in torch.OutOfMemoryError strikes in `phase` of step 8."""
    config = Config(output_dir=str(tmp_path), device="cuda", prompts_per_step=64, num_generations=8, **settings)
    monkeypatch.setattr(run, "checkpoint_steps", lambda output_dir: list(saved))
    with pytest.raises(RunError) as error:
        with run.start(config) as state:
            state.model, state.step = object(), 7
            with state.clock(phase):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return str(error.value)


def test_an_out_of_memory_error_is_one_line_naming_the_setting_and_the_resume(tmp_path, monkeypatch):
    line = out_of_memory_line(tmp_path, monkeypatch, "log-prob forward", saved=[5], micro_batch=4)
    assert "\n" not in line and "step 8's log-prob forward at --micro-batch 4: lower it" in line
    assert f"python train.py --resume {tmp_path} --micro-batch 2 continues from checkpoint-5" in line
    line = out_of_memory_line(tmp_path, monkeypatch, "rollout", rollout_batch=256)
    assert "step 8's rollout at --rollout-batch 256" in line and "same command with --rollout-batch 128" in line
    line = out_of_memory_line(tmp_path, monkeypatch, "rollout")
    assert "at --rollout-batch 512" in line and "--rollout-batch 256" in line
    assert "--micro-batch 1, the least" in out_of_memory_line(tmp_path, monkeypatch, "log-prob forward", micro_batch=1)


# --- the host's memory for offloaded states -----------------------------------------------------------------------
def test_offloaded_states_larger_than_the_host_are_one_note_before_step_1(monkeypatch, capsys):
    config = Config(model="Qwen/Qwen2.5-3B-Instruct", device="cuda", dtype="bf16", param_dtype="bf16",
                    optimizer_offload=True, max_prompt_length=256, style="chat")
    monkeypatch.setattr(settle, "machine_memory", lambda device: (32e9, "this machine's total RAM")
                        if device == "cpu" else None)
    settle.within_machine(config)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "--optimizer-offload keeps 37.0" in out and "32GB" in out
    monkeypatch.setattr(settle, "machine_memory", lambda device: (256e9, "RAM") if device == "cpu" else None)
    settle.within_machine(config)
    assert capsys.readouterr().out == ""
