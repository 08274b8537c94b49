"""A run that says when it learns nothing, checks what it needs before it starts, and leaves nothing in the way
(issue 40): the idle-step note and stop, the steps that trained, the warm start that ends at pass@1 0, the optional
libraries checked before torch, W&B's login failure in one line before any file, a folder whose only run file is
metrics.jsonl reused, the warm start's cache key, one per-step time in the bar, the samples table's prompts."""
import json
import os
import re
import subprocess
import sys

import pytest

import tasks
import train
from harness import advice, config, console, flags as flags_module, report, stops, tiny
from tests.stubs import SMALL_TRAIN as SMALL, DigitsTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("digits_task")


def train_rows(out):
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [row for row in rows if not row.get("eval")]


# --- 1. a run that learns nothing says so, then stops with a checkpoint -----------------------------------------------
def test_steps_that_learn_nothing_are_named_then_stop_the_run_resumably(tmp_path, capsys):
    # The random tiny model never solves Countdown: every reward is 0, every group ties, no step has a gradient.
    out = str(tmp_path / "run")
    flags = ["--task", "countdown", *SMALL, "--output-dir", out, "--steps", "8", "--idle-warn", "2", "--idle-stop", "4"]
    with pytest.raises(SystemExit) as exit_info:
        train.main(flags)
    captured = capsys.readouterr()
    assert exit_info.value.code == stops.IDLE_EXIT == 3
    assert [row["optimizer_steps"] for row in train_rows(out)] == [0, 0, 0, 0]  # it stopped at step 4
    notes = [line for line in captured.out.splitlines() if line.startswith("note:") and "learned nothing" in line]
    assert len(notes) == 1 and notes[0].startswith("note: 2 steps in a row learned nothing")
    assert "--temperature 1" in notes[0] and "--warm-start-steps" in notes[0] and "--idle-stop 0" in notes[0]
    assert "stopped at step 4: 4 steps in a row learned nothing" in captured.out
    assert "steps that trained (took an optimizer step): 0 of 4" in captured.out
    assert "nothing learned (rewards tied)" in captured.err  # the bar
    assert os.path.isdir(os.path.join(out, "checkpoint-4"))
    # resumed as it was, the run had 4 idle steps already: the next one stops it again (the streak is restored)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", out])
    assert exit_info.value.code == 3 and [row["step"] for row in train_rows(out)] == [1, 2, 3, 4, 5]
    # told to go on, it runs to the end
    result = train.main(["--resume", out, "--idle-stop", "0"])
    assert result["metrics_path"] and len(train_rows(out)) == 8
    assert "steps that trained (took an optimizer step): 0 of 8" in capsys.readouterr().out


def test_a_run_that_trains_prints_no_note_and_counts_its_steps(tmp_path, capsys):
    out = str(tmp_path / "run")
    train.main(["--task", "digits", *SMALL, "--output-dir", out, "--steps", "3"])
    captured = capsys.readouterr()
    trained = sum(row["optimizer_steps"] > 0 for row in train_rows(out))
    assert trained == 3  # the stub's graded reward: groups do not tie
    assert f"steps that trained (took an optimizer step): {trained} of 3" in captured.out
    assert "learned nothing" not in captured.out and "nothing learned" not in captured.err


def test_the_bar_shows_one_time_per_step(tmp_path, capsys):
    train.main(["--task", "digits", *SMALL, "--output-dir", str(tmp_path / "run"), "--steps", "2"])
    bar = capsys.readouterr().err
    assert re.search(r"\d+\.\d{2} s/step", bar) and not re.search(r"s/it|it/s", bar)  # tqdm's rate left out


def test_a_warm_start_that_ends_at_pass_0_says_so_before_rl(tmp_path, monkeypatch, capsys):
    never = DigitsTask(pass_threshold=2.0)  # a reward of at most 1 never passes
    monkeypatch.setitem(tasks.TASKS, "never", lambda data=None: never)
    train.main(["--task", "never", *SMALL, "--warm-start-steps", "2", "--steps", "0",
                "--output-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    note = out.index("note: the warm start ended at held-out pass@1 0.000 after 2 steps")
    assert note < out.index("step 0: held-out pass@1")


# --- 2. what a run needs, checked before it starts --------------------------------------------------------------------
@pytest.mark.parametrize("flags,module,pip", [
    (["--optimizer", "adamw8bit"], "torchao", "pip install torchao"),
    (["--lora-rank", "8"], "peft", "pip install peft"),
    (["--report-to", "tensorboard"], "tensorboard", "pip install tensorboard"),
    (["--report-to", "tensorboard,wandb"], "wandb", "pip install wandb"),
    (["--task", "gsm8k", "--data", "x.jsonl"], "math_verify", "pip install math-verify"),
    (["--task", "deepmath", "--data", "x.jsonl"], "math_verify", "pip install math-verify"),
])
def test_each_optional_library_a_setting_needs_is_named(monkeypatch, flags, module, pip):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(config.InputError, match=re.escape(pip)):
        flags_module.check_libraries(flags_module.parse_args(flags))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B without a key then (flags.check_wandb_login)
    flags_module.check_libraries(flags_module.parse_args(flags))  # all installed: nothing to say
    # rules that need no math-verify are not stopped by its absence
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    flags_module.check_libraries(flags_module.parse_args(["--task", "gsm8k", "--data", "x", "--task-option",
                                                         "rules=last_number"]))


def test_a_missing_library_stops_the_command_line_before_torch(tmp_path):
    # torchao is not installed in this environment: the real process answers in one line, torch never imported.
    if importlib_available("torchao"):
        pytest.skip("torchao is installed")
    code = ("import sys, runpy; sys.argv = ['train.py', '--optimizer', 'adamw8bit', '--output-dir', sys.argv[1]]\n"
            "try:\n    runpy.run_path('train.py', run_name='__main__')\n"
            "finally:\n    print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["train.py: error: --optimizer adamw8bit needs torchao: pip install torchao",
                                        "no torch"]
    assert not (tmp_path / "run").exists()


def test_a_config_from_python_is_checked_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    monkeypatch.setattr(train.policy, "build_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(config.Config(task="digits", lora_rank=4, output_dir=str(tmp_path / "run")))
    assert exit_info.value.code == 2
    assert "--lora-rank needs peft: pip install peft" in capsys.readouterr().err


def importlib_available(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def test_wandb_without_a_login_is_one_line_and_the_same_command_then_runs(tmp_path, monkeypatch):
    # A real process and a real W&B: no API key, no WANDB_MODE. wandb.init refuses before any network; the run stops
    # in one line naming both ways out, before metrics.jsonl exists, so the same command with WANDB_MODE=offline
    # starts in that folder (it used to leave an empty metrics.jsonl: "holds a run").
    pytest.importorskip("wandb")
    out, home = tmp_path / "run", tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_SILENT="true")
    command = [sys.executable, "train.py", "--task", "countdown", *SMALL, "--steps", "1", "--output-dir", str(out),
               "--report-to", "wandb"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert "`wandb login`" in errors[0] and "WANDB_MODE=offline" in errors[0]
    assert not (out / "metrics.jsonl").exists()
    # the same flags offline, in this process (the folder is the point; test_report.py runs W&B offline so too)
    for key in [key for key in os.environ if key.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    train.main(command[2:])
    assert [row["step"] for row in train_rows(str(out))] == [1]


def run_in_terminal(command, env, stdin_closed, timeout=300):
    """A real process whose stderr (and stdin, unless stdin_closed: fd 0 closed) is a pseudo-terminal, as in a shell;
    a prompt it shows gets EOF (Ctrl-D). -> (exit code, stdout, the terminal's text)."""
    import pty
    import select
    import time
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=secondary,
                            stdin=subprocess.DEVNULL if stdin_closed else secondary,
                            preexec_fn=(lambda: os.close(0)) if stdin_closed else None)
    os.close(secondary)
    screen, deadline, answered = b"", time.time() + timeout, False
    while time.time() < deadline:
        if select.select([primary], [], [], 1)[0]:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: every copy of the terminal's other end is closed (the process ended)
                break
            screen += chunk
            if b"Enter your choice" in screen and not answered:  # W&B's login prompt
                os.write(primary, b"\x04")
                answered = True
        elif proc.poll() is not None:
            break
    os.close(primary)
    if proc.poll() is None:  # still running at the deadline
        proc.kill()
    return proc.wait(), proc.stdout.read().decode(), screen.decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.parametrize("stdin_closed", [False, True], ids=["terminal", "stdin-closed"])
def test_wandb_online_without_a_key_is_one_line_before_torch_loads_and_never_a_prompt(tmp_path, stdin_closed):
    # W&B online (no WANDB_MODE) and no key where it looks (HOME empty: no netrc, no settings file). On a terminal
    # wandb.init asked for a key once the model had loaded, and EOF there was a KeyboardInterrupt traceback; without
    # a terminal it was one line, but only after the model loaded. Now: decided before torch loads, one line.
    pytest.importorskip("wandb")
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_") and key != "NETRC"}
    env.update(HOME=str(home), TERM="xterm")
    reports_torch = ("import runpy, sys\nsys.argv[0] = 'train.py'\ntry:\n    runpy.run_path('train.py', "
                     "run_name='__main__')\nfinally:\n    print('torch loaded:', 'torch' in sys.modules)")
    code, out, screen = run_in_terminal(
        [sys.executable, "-c", reports_torch, "--task", "countdown", *SMALL, "--steps", "1", "--output-dir",
         str(tmp_path / "run"), "--report-to", "wandb"], env, stdin_closed)
    lines = [line for line in screen.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in screen and "choice" not in screen, screen
    assert lines[0].startswith("train.py: error: --report-to wandb:") and "`wandb login`" in lines[0]
    assert "WANDB_API_KEY" in lines[0] and "WANDB_MODE=offline" in lines[0]
    assert out.split() == ["torch", "loaded:", "False"]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_folder_whose_only_run_file_is_metrics_is_started_afresh(tmp_path, capsys):
    # What a run that stopped before its first checkpoint leaves (here: the empty file older versions left after a
    # W&B failure); nothing in it can be resumed, so the same command starts, keeping the rows aside.
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    train.main(["--task", "digits", *SMALL, "--output-dir", str(out), "--steps", "1"])
    assert "kept as unsaved-metrics.jsonl, starting afresh" in capsys.readouterr().out
    assert (out / "unsaved-metrics.jsonl").read_text() == "" and len(train_rows(str(out))) == 1
    # a run with a checkpoint is still a run: refused
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--task", "digits", *SMALL, "--output-dir", str(out), "--steps", "1"])
    assert exit_info.value.code == 1 and "holds a run" in capsys.readouterr().err


def test_a_bug_before_the_first_checkpoint_leaves_the_folder_to_the_same_command(tmp_path, monkeypatch, capsys):
    original, calls = train.update_batch, []

    def broken_at_step_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a shape check tripped")
        return original(*args, **kwargs)
    monkeypatch.setattr(train, "update_batch", broken_at_step_2)
    flags = ["--task", "digits", *SMALL, "--output-dir", str(tmp_path / "run"), "--steps", "3"]
    with pytest.raises(ValueError, match="a shape check tripped"):
        train.main(flags)
    assert "with no checkpoint: the same command starts afresh" in capsys.readouterr().err
    monkeypatch.setattr(train, "update_batch", original)
    train.main(flags)
    assert [row["step"] for row in train_rows(str(tmp_path / "run"))] == [1, 2, 3]
    assert [row["step"] for row in map(json.loads, open(tmp_path / "run" / "unsaved-metrics.jsonl"))] == [0, 1]


# --- 3. the small things ---------------------------------------------------------------------------------------------
def test_the_eval_size_does_not_change_the_warm_start(tmp_path, capsys):
    # The warm start's stopping rule reads its own held-out draw (tiny.WARM_START_EVAL_SIZE), so --eval-size leaves
    # it, and its cache, alone: a second run with another eval size loads the first one's warm start.
    cache = str(tmp_path / "cache")
    for eval_size in ("4", "6"):
        train.main(["--task", "digits", *SMALL, "--warm-start-steps", "2", "--warm-start-cache", cache,
                    "--eval-size", eval_size, "--steps", "0", "--output-dir", str(tmp_path / f"run{eval_size}")])
    out = capsys.readouterr().out
    assert out.count("warm start: supervised steps") == 1 and out.count("warm start: loaded") == 1
    assert len(os.listdir(cache)) == 1
    settings = lambda argv: tiny.warm_start_settings(flags_module.parse_args(argv))  # noqa: E731
    assert settings(["--eval-size", "4"]) == settings([]) != settings(["--max-new-tokens", "8"])


def test_the_tensorboard_samples_table_has_the_prompts(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = tmp_path / "run"
    train.main(["--task", "digits", *SMALL, "--output-dir", str(out), "--steps", "1", "--report-to", "tensorboard"])
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    table = events.Tensors("eval/samples/text_summary")[0].tensor_proto.string_val[0].decode()
    first = DigitsTask().examples("test", 4, seed=0)[0]
    assert table.startswith("| reward | prompt | completion |")
    assert f"| {repr(DigitsTask().prompt(first, 'compact'))} |" in table.splitlines()[2]


def test_plot_metrics_over_two_runs_writes_into_the_current_folder(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    from experiments import plot_metrics
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(
            json.dumps({"step": step, "reward_mean": 0.1 * step}) + "\n" for step in range(1, 4)))
    monkeypatch.chdir(tmp_path)
    plot_metrics.main([str(tmp_path / "a"), str(tmp_path / "b")])
    assert f"wrote {tmp_path / 'metrics.png'}" in capsys.readouterr().out
    assert (tmp_path / "metrics.png").exists() and not (tmp_path / "a" / "metrics.png").exists()
    plot_metrics.main([str(tmp_path / "b")])  # one run: beside its metrics.jsonl, as before
    assert f"wrote {tmp_path / 'b' / 'metrics.png'}" in capsys.readouterr().out


def test_the_samples_table_names_a_chat_prompts_user_message():
    assert report.prompt_text([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]) \
        == "2+2?"
    assert report.prompt_text("3>") == "3>"


# --- numbers that say their noise, samples that say what was asked (issue 64) -----------------------------------------
def test_the_end_table_says_each_pass_its_noise_and_whether_the_change_is_resolved(tmp_path, capsys):
    train.main(["--task", "digits", *SMALL, "--output-dir", str(tmp_path / "run"), "--steps", "2"])
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith("pass@1 +/- its standard error")]
    assert "within noise" in line and "2 sqrt(se0^2 + se^2) = " in line
    # the issue's "larger of two 2-digit numbers", 40 steps on 200 prompts: 0.115 -> 0.160, noise 0.069
    se = lambda p: (p * (1 - p) / 199) ** 0.5  # noqa: E731
    noise_line = lambda before, after: advice.end_lines(config.Config(), before, [(40, after)], [], 200, None)[0][0]  # noqa: E731
    short = noise_line({"pass@1": 0.115, "pass@1_se": se(0.115)}, {"pass@1": 0.160, "pass@1_se": se(0.160)})
    assert "0.115 +/- 0.023 -> 0.160 +/- 0.026" in short and "= 0.069: within noise" in short
    longer = noise_line({"pass@1": 0.115, "pass@1_se": se(0.115)}, {"pass@1": 0.305, "pass@1_se": se(0.305)})
    assert "resolved: a gain beyond the noise" in longer


def test_each_printed_sample_shows_prompt_completion_and_expected_answer_on_one_line(tmp_path, capsys):
    train.main(["--task", "digits", *SMALL, "--output-dir", str(tmp_path / "run"), "--steps", "0"])
    samples = [line for line in capsys.readouterr().out.splitlines() if line.startswith("    reward ")]
    assert len(samples) == console.SAMPLES_SHOWN
    assert all(re.fullmatch(r"    reward \d\.\d{3}  '\d+>' -> '.*'  \(expected '777'\)", line) for line in samples)
    long = console.sample_line(DigitsTask(), [{"x": 1}], ["a\nlong " * 30], 0, "x\n" * 80, 0.5)
    assert "\n" not in long and len(long) < 200 and long.count("...") == 2
    assert console.sample_line(object(), [{"x": 1}], [], 0, "7", 1.0) == "    reward 1.000  '7'"


# --- a quiet start (issue 64) -----------------------------------------------------------------------------------------
def test_library_noise_is_dropped_by_its_own_message_on_its_own_logger_only(capsys):
    import logging

    import harness
    def drops(name, msg):
        record = logging.LogRecord(name, logging.WARNING, "", 0, msg, (), None)
        return not all(f.filter(record) for f in logging.getLogger(name).filters)
    assert drops("torchao", "Failed to load /x/torchao/_C_mxfp8.so: Could not load this library")
    assert drops("torch.utils._pytree", harness.LIBRARY_NOISE["torch.utils._pytree"][0] + " by torch.compile ...")
    assert not drops("torchao", "Skipping import of cpp extensions")  # their other warnings still show
    assert not drops("torch.utils._pytree", "something else")
    assert not drops("harness.run", "Failed to load ")  # and the project's, whatever they say


@pytest.mark.slow
def test_importing_the_trainer_prints_no_library_noise():
    # a real process: transformers imports the installed torchao (its .so files fail to load on this CPU build) and
    # torchao registers Enums with torch's pytree; neither says anything now
    pytest.importorskip("torchao")
    proc = subprocess.run([sys.executable, "-c", "import train, harness.run, harness.tiny"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == ""
