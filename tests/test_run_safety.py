"""A run that cannot be hijacked, overwritten or lost: each case below broke the run lifecycle before, as an attacker
or a careless user would meet it. Every failure is one line naming the file, flag or process, with the right exit
code (2: a flag, 1: the run's files)."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from harness import checkpoint
from harness import config
import train
import tasks
from tests.stubs import SMALL_TRAIN as SMALL, DigitsTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("digits_task")


def run(out, *extra):
    return train.main(["--task", "digits", "--output-dir", str(out), *SMALL, *extra])


def one_line_error(capsys, exit_info, code):
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]  # the progress bar may precede it
    assert exit_info.value.code == code and "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith("train.py: error:")
    return errors[0]


def fails(capsys, argv, code=1):
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    return one_line_error(capsys, exit_info, code)


@pytest.fixture
def finished_run(tmp_path):
    out = tmp_path / "run"
    run(out, "--steps", "4", "--save-every", "2", "--keep-checkpoints", "0")
    return str(out)


# --- 1. a checkpoint loads no code -----------------------------------------------------------------------------------
class Payload:  # what an attacker pickles: unpickling it calls a function of their choice
    def __init__(self, canary):
        self.canary = canary

    def __reduce__(self):
        return (os.mkdir, (self.canary,))


def test_a_checkpoint_that_would_run_code_is_refused(finished_run, tmp_path, capsys):
    canary = str(tmp_path / "canary")
    path = os.path.join(finished_run, "checkpoint-4", checkpoint.TRAINER_STATE)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "rng": Payload(canary)}, path)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "refused" in err and "posix.mkdir" in err and not os.path.exists(canary)


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_model_folder_that_ships_python_code_is_refused(finished_run, tmp_path, where):
    # A save_pretrained folder whose config names its own code (auto_map -> evil.py). transformers would ask "run the
    # custom code? [y/N]"; a "y" on stdin must change nothing: the folder is refused in one line, evil.py never runs.
    folder = tmp_path / "model"
    os.system(f"cp -r {finished_run}/checkpoint-4 {folder}")
    canary = tmp_path / "canary"
    (folder / "evil.py").write_text(f"open({str(canary)!r}, 'w').write('ran')\nfrom transformers import "
                                    "LlamaForCausalLM as EvilModel, PreTrainedTokenizerFast as EvilTokenizer\n")
    settings = json.loads((folder / where).read_text())
    settings["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel", "AutoConfig": "evil.EvilModel",
                            "AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / where).write_text(json.dumps(settings))
    proc = subprocess.run([sys.executable, "train.py", "--model", str(folder), "--output-dir", str(tmp_path / "run"),
                           "--steps", "1"], cwd=REPO, input="y\ny\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{where} names its own Python code (auto_map)" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not canary.exists()


@pytest.mark.parametrize("damage,message", [
    (lambda f: (os.remove(f / "tokenizer_config.json"), os.symlink("/dev/zero", f / "tokenizer_config.json")),
     "tokenizer_config.json is not a regular file of at most"),
    (lambda f: os.mkfifo(f / "chat_template.jinja"), "chat_template.jinja is not a regular file"),
    (lambda f: (f / "chat_template.jinja").write_text("{{ 'x' }}" * 40_000), "chat_template.jinja is not a regular"),
    (lambda f: (f / "tokenizer_config.json").write_text(json.dumps(
        {**json.loads((f / "tokenizer_config.json").read_text()), "chat_template": "{{ 'x' }}" * 40_000})),
     "its chat template is over"),
])
def test_a_model_folder_with_an_endless_or_huge_file_is_refused_at_once(finished_run, tmp_path, capsys, damage,
                                                                        message):
    folder = tmp_path / "model"
    os.system(f"cp -r {finished_run}/checkpoint-4 {folder}")
    damage(folder)
    start = time.time()
    assert message in fails(capsys, ["--model", str(folder), "--output-dir", str(tmp_path / "run")], code=2)
    assert time.time() - start < 30


def test_a_chat_template_that_loops_is_stopped_in_seconds(digits_task):
    import types
    from harness import prompts, tiny
    tokenizer = tiny.build_char_tokenizer()
    tokenizer.chat_template = ("{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0]['content'] }}"
                               "{% endfor %}{% endfor %}")  # 10^10 iterations: hours
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=128))
    task, settings = DigitsTask(), config.Config(style="chat")
    start = time.time()
    with pytest.raises(config.InputError, match="rendering the held-out prompts took over 2.0 s"):
        prompts.within_context(None, task.examples("test", 4, seed=0), model, tokenizer, task, settings)
    assert time.time() - start < 10


@pytest.mark.parametrize("template, message", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0]['content'] }}{% endfor %}{% endfor %}",
     "took over"),  # blamed on --model (tiny), which has no template at all
    ("{{ messages[0]['content'].__class__.__mro__ }}", "failed (SecurityError: access to attribute '__class__'"),
    ("{{ raise_exception('no user role here') }}", "failed (TemplateError: no user role here)"),
    ("{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}", "failed (TypeError"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "failed (RecursionError"),
])
def test_a_checkpoints_chat_template_that_fails_is_one_line_naming_the_checkpoint(finished_run, capsys, template,
                                                                                   message):
    # the tokenizer of a resumed run is the checkpoint's: its template failing was a traceback (the sandbox's
    # refusal, raise_exception, an error in its code) or, looping, blamed on the original --model
    checkpoint_dir = os.path.join(finished_run, "checkpoint-4")
    path = os.path.join(checkpoint_dir, "run.json")
    json.dump({**json.load(open(path)), "style": "chat"}, open(path, "w"))  # a chat model's run
    open(os.path.join(checkpoint_dir, "chat_template.jinja"), "w").write(template)
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    started = time.time()
    err = fails(capsys, ["--resume", finished_run, "--steps", "6"], code=1)
    assert f"the chat template of {checkpoint_dir} " in err and message in err and "chat_template" in err, err
    assert time.time() - started < 30
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before


def test_a_bug_outside_the_chat_template_keeps_its_traceback(digits_task):
    # only the template's own errors become one line: a task's prompt() that raises is a bug, not the template's
    import types
    from harness import prompts, tiny
    tokenizer = tiny.build_char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=128))
    task = DigitsTask()
    task.prompt = lambda example, style="chat": [{"role": "user", "content": str(1 / 0)}]
    with pytest.raises(ZeroDivisionError):
        prompts.within_context(None, DigitsTask().examples("test", 4, seed=0), model, tokenizer, task,
                               config.Config(style="chat"))


def test_a_prompt_longer_than_the_context_is_one_line(tmp_path, capsys, monkeypatch):
    class LongPrompts(DigitsTask):
        def prompt(self, example, style="chat"):  # BOS + 151 characters: more than the tiny model's 128 positions
            return "9" * 150 + ">"
    monkeypatch.setitem(tasks.TASKS, "digits", lambda data=None: LongPrompts())
    err = fails(capsys, ["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL], code=2)
    assert "the held-out prompts: prompt 1 is 152 tokens; with --max-new-tokens 6 it needs 158 positions" in err
    assert "--max-prompt-length 122" in err and not os.path.exists(tmp_path / "run" / "checkpoint-1")


def test_every_load_passes_trust_remote_code_false(finished_run, monkeypatch):
    # For a hub model the folder cannot be read first: transformers itself must refuse remote code.
    import transformers
    seen = []
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained.__func__

        def recording(klass, *args, _original=original, **kwargs):
            seen.append((klass.__name__, kwargs.get("trust_remote_code")))
            return _original(klass, *args, **kwargs)
        monkeypatch.setattr(cls, "from_pretrained", classmethod(recording))
    from harness.model import load_policy
    load_policy(os.path.join(finished_run, "checkpoint-4"))
    assert sorted(seen) == [("AutoModelForCausalLM", False), ("AutoTokenizer", False)]


def test_trainer_state_holds_only_tensors_and_plain_values(finished_run):
    state = torch.load(os.path.join(finished_run, "latest", checkpoint.TRAINER_STATE), weights_only=True)
    assert set(state) >= {"step", "optimizer", "rng", "initial_eval"} and state["step"] == 4


# --- 2. a second run never destroys the first ------------------------------------------------------------------------
def test_a_fresh_run_into_a_folder_holding_a_run_stops(finished_run, capsys):
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--task", "digits", "--output-dir", finished_run, *SMALL, "--steps", "2"])
    assert "holds a run" in err and "--resume" in err and "--overwrite" in err
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before
    assert checkpoint.checkpoint_steps(finished_run) == [2, 4]


def test_overwrite_starts_afresh_and_keeps_its_own_checkpoints(finished_run):
    run(finished_run, "--steps", "2", "--save-every", "1", "--overwrite")
    assert checkpoint.checkpoint_steps(finished_run) == [1, 2]  # the old 4 is gone, not kept over the new ones
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-2")
    assert [json.loads(line)["step"] for line in open(os.path.join(finished_run, "metrics.jsonl"))] == [0, 1, 2, 2]


def test_resuming_an_older_checkpoint_with_fewer_kept_never_prunes_what_it_writes(finished_run, capsys):
    train.main(["--resume", os.path.join(finished_run, "checkpoint-2"), "--keep-checkpoints", "1",
                "--save-every", "1", "--steps", "3"])
    out = capsys.readouterr().out
    assert "resumed from step 2" in out and "checkpoint-4 of this run will be replaced" in out
    assert checkpoint.checkpoint_steps(finished_run) == [3]  # 4 belonged to the replaced timeline
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-3")
    train.main(["--resume", finished_run, "--steps", "4"])  # and the run goes on from there
    assert checkpoint.checkpoint_steps(finished_run) == [4]


# --- 3. one run per folder -------------------------------------------------------------------------------------------
def hold_lock(folder):
    """Another process that takes the folder's lock as a run does (checkpoint.locked) and holds it: -> Popen."""
    code = (f"import sys, time; sys.path.insert(0, {REPO!r})\nfrom harness.checkpoint import locked\n"
            f"with locked({str(folder)!r}):\n    print('locked', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_run_in_the_same_folder_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = hold_lock(out)
    try:
        err = fails(capsys, ["--task", "digits", "--output-dir", str(out), *SMALL, "--steps", "1"])
        assert f"in use by process {holder.pid} on {socket.gethostname()}, started 20" in err
        assert not (out / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    run(out, "--steps", "1")  # its process is gone (killed: no clean-up of its own), so is its lock


def test_resuming_a_live_run_that_has_no_checkpoint_yet_names_it(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "eval": true}\n')
    holder = hold_lock(out)
    try:
        err = fails(capsys, ["--resume", str(out)])
        assert f"its run is still going (process {holder.pid} on" in err and "wait for its first checkpoint" in err
    finally:
        holder.kill()
        holder.wait()


def test_resuming_a_live_run_that_saves_every_step_names_it_before_torch_loads(tmp_path):
    # A live run prunes the checkpoint a resume has just chosen: "model path does not exist" (after torch loaded)
    # instead of the process that holds the folder. A real run, in another process, saving every step.
    out = str(tmp_path / "run")
    trainer = subprocess.Popen([sys.executable, "train.py", "--task", "countdown", "--output-dir", out, *SMALL,
                                "--steps", "10000", "--save-every", "1", "--keep-checkpoints", "1",
                                "--eval-every", "10000", "--idle-stop", "0"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code = ("import sys; from harness import config\ntry:\n    config.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    try:
        deadline = time.time() + 240
        while not checkpoint.checkpoint_steps(out) and time.time() < deadline:
            time.sleep(0.2)
        for target in [out, out, os.path.join(out, "latest"), out]:
            proc = subprocess.run([sys.executable, "-c", code, "--resume", target], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            assert proc.stdout.split() == ["False", "1"], proc.stderr
            assert f"is in use by process {trainer.pid} on" in proc.stderr and "still going" in proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    finally:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=120)
    assert trainer.returncode == 143  # it saved and stopped as always


def test_a_lock_file_nobody_holds_is_no_lock(tmp_path):
    # What a dead run leaves, even naming a live PID (a recycled one, or a process in another PID namespace):
    # only a held flock refuses, so such a file neither blocks forever nor lets a second run in.
    out = tmp_path / "run"
    out.mkdir()
    (out / checkpoint.LOCK).write_text(f"process {os.getppid()} on {socket.gethostname()}, started long ago\n")
    run(out, "--steps", "1")
    assert (out / "metrics.jsonl").exists()


def test_runs_entering_the_lock_at_the_same_instant_get_it_once(tmp_path):
    # 12 processes wait for the same instant, then all try the lock; whoever gets it holds it 2 s. Exactly one may
    # enter (the old O_EXCL-then-write-the-PID lock let a second one in, reading the empty file as stale).
    start_at = time.time() + 3.0
    code = (f"import sys, time; sys.path.insert(0, {REPO!r})\nfrom harness.checkpoint import RunError, locked\n"
            f"time.sleep(max(0.0, {start_at} - time.time()))\n"
            f"try:\n    with locked({str(tmp_path)!r}):\n        print('entered', flush=True)\n"
            f"        time.sleep(2)\nexcept RunError as error:\n    print('refused', error)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(12)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert sum(out.startswith("entered") for out in outputs) == 1, outputs
    assert sum(out.startswith("refused") and "is in use by" in out for out in outputs) == 11, outputs


# --- 4. a full disk is one line, and leftovers of a kill are put right ----------------------------------------------
@pytest.mark.parametrize("error", ["safetensors", "torch"])
def test_a_save_that_raises_any_error_is_one_line_and_leaves_no_tmp(finished_run, capsys, monkeypatch, error):
    if error == "safetensors":
        from safetensors import SafetensorError

        def fail(self, path, *args, **kwargs):
            os.makedirs(path, exist_ok=True)
            raise SafetensorError("Error while serializing: IoError(No space left on device)")
        from transformers import PreTrainedModel
        monkeypatch.setattr(PreTrainedModel, "save_pretrained", fail)
    else:
        def fail(*args, **kwargs):
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1024 vs 512")
        monkeypatch.setattr(torch, "save", fail)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "could not write checkpoint" in err and "checkpoint-5" in err
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")
    assert not [name for name in os.listdir(finished_run) if name.endswith(".tmp")]


def test_leftovers_of_a_kill_are_cleaned_at_the_next_start(finished_run):
    half = os.path.join(finished_run, "checkpoint-6.tmp")  # a save killed half-way: its mark, no run.json yet
    os.makedirs(half)
    open(os.path.join(half, checkpoint.SAVE_MARK), "w").close()
    train.main(["--resume", finished_run, "--steps", "5"])
    assert not os.path.exists(half) and checkpoint.checkpoint_steps(finished_run) == [2, 4, 5]


def test_copies_a_user_made_beside_the_checkpoints_are_left_alone(finished_run, capsys):
    for name in ("checkpoint-2.old", "checkpoint-3.tmp", "checkpoint-4-best"):  # unmarked: not a save's leftovers
        os.system(f"cp -r {finished_run}/checkpoint-4 {finished_run}/{name}")
        os.remove(os.path.join(finished_run, name, checkpoint.SAVE_MARK))
    os.system(f"rm -r {finished_run}/checkpoint-2")  # the .old's name would once have restored it
    train.main(["--resume", finished_run, "--steps", "5"])
    assert {"checkpoint-2.old", "checkpoint-3.tmp", "checkpoint-4-best"} <= set(os.listdir(finished_run))
    assert checkpoint.checkpoint_steps(finished_run) == [4, 5] and "restored" not in capsys.readouterr().out
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-3.tmp"), "--steps", "6"])
    assert "must be named checkpoint-<step>" in err


def test_a_users_folder_in_the_way_of_a_save_stops_the_run_and_stays(finished_run, capsys):
    os.makedirs(os.path.join(finished_run, "checkpoint-5.tmp", "mine"))
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "checkpoint-5.tmp is in the way of this run's next save" in err
    assert os.path.isdir(os.path.join(finished_run, "checkpoint-5.tmp", "mine"))


# --- 5. a kill between the two renames of a save -------------------------------------------------------------------
def test_a_dangling_latest_falls_back_to_the_newest_complete_checkpoint(finished_run, capsys):
    # the window of a re-save of step 4: the old checkpoint-4 deleted, the new one still at .tmp, `latest` dangling
    os.system(f"cp -r {finished_run}/checkpoint-4 {finished_run}/checkpoint-4.tmp")
    os.system(f"rm -r {finished_run}/checkpoint-4")
    train.main(["--resume", finished_run, "--steps", "5"])
    out = capsys.readouterr().out
    assert "the newest complete one" in out and "resumed from step 4" in out
    assert checkpoint.checkpoint_steps(finished_run) == [2, 4, 5]
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-5")


def test_a_run_copied_with_its_links_followed_resumes_as_the_original(finished_run, tmp_path, capsys):
    import shutil
    copy = str(tmp_path / "copy")
    shutil.copytree(finished_run, copy, symlinks=False)  # cp -rL, scp -r: `latest` becomes a folder
    assert os.path.isdir(os.path.join(copy, "latest")) and not os.path.islink(os.path.join(copy, "latest"))
    train.main(["--resume", copy, "--steps", "5"])
    assert "resuming from checkpoint-4, its twin" in capsys.readouterr().out
    assert os.path.realpath(os.path.join(copy, "latest")) == os.path.join(os.path.realpath(copy), "checkpoint-5")
    train.main(["--resume", finished_run, "--steps", "5"])
    timing = ("rollout_s", "update_s", "tokens_per_s")
    rows = [[{k: v for k, v in json.loads(line).items() if k not in timing} for line in open(f"{run}/metrics.jsonl")]
            for run in (finished_run, copy)]
    assert rows[0] == rows[1]
    other = str(tmp_path / "other")
    shutil.copytree(finished_run, other, symlinks=False)
    torch.save({"not": "a twin"}, os.path.join(other, "latest", "trainer_state.pt"))
    assert "copies none of its checkpoint-<step> folders" in fails(capsys, ["--resume", other, "--steps", "6"])


# --- 6. files that parse but are wrong -------------------------------------------------------------------------------
@pytest.mark.parametrize("damage,message", [
    (lambda s: {k: v for k, v in s.items() if k != "optimizer"}, "no valid 'optimizer'"),
    (lambda s: {**s, "step": "four"}, "no valid 'step'"),
    (lambda s: [1, 2], "no valid 'step'"),
    (lambda s: {**s, "step": -5}, "its 'step' -5 is not the step of checkpoint-4"),  # trained at negative lr
    (lambda s: {**s, "step": 2}, "its 'step' 2 is not the step of checkpoint-4"),
    (lambda s: {**s, "initial_eval": {}}, "no valid 'initial_eval'"),
    (lambda s: {**s, "rng": {"torch": 1}}, "its RNG states are unusable"),
])
def test_a_trainer_state_without_its_keys_is_one_line(finished_run, capsys, damage, message):
    path = os.path.join(finished_run, "checkpoint-4", checkpoint.TRAINER_STATE)
    torch.save(damage(torch.load(path, weights_only=True)), path)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert message in err and "trainer_state.pt" in err


@pytest.mark.parametrize("damage,message", [
    (lambda s: [], "not a JSON object"),
    (lambda s: {k: v for k, v in s.items() if k != "tau"}, "missing ['tau']"),
    (lambda s: {**s, "num_generations": 0}, "--num-generations must be >= 2"),
    (lambda s: {**s, "tau": "hot"}, "run.json"),
    (lambda s: {**s, "lr": True}, "--lr must be a number, got True"),  # trained at lr 1.0
    (lambda s: {**s, "steps": "10"}, "--steps must be an integer, got '10'"),
    (lambda s: {**s, "method": "nope"}, "--method must be one of softmax, grpo"),
    (lambda s: {**s, "loss_agg": 3}, "--loss-agg must be text, got 3"),
    # the settings only run.json holds: named by their key, before torch loads (style "weird" failed after it)
    (lambda s: {**s, "style": "weird"}, "the setting 'style' must be one of chat, compact, got 'weird'"),
    (lambda s: {**s, "report_to": "wandb", "wandb_run_id": "a/b"}, "the setting 'wandb_run_id' must match"),
    (lambda s: {**s, "report_to": "wandb", "wandb_run_id": ""}, "the setting 'wandb_run_id' must match"),
    (lambda s: {**s, "task_file_sha256": "not a hash"}, "the setting 'task_file_sha256' must match"),
])
def test_saved_settings_pass_the_same_checks_as_flags(finished_run, capsys, monkeypatch, damage, message):
    monkeypatch.setenv("WANDB_MODE", "offline")  # a W&B run id: wandb itself would refuse it, blaming the login
    path = os.path.join(finished_run, "checkpoint-4", "run.json")
    saved = json.load(open(path))
    json.dump(damage(saved), open(path, "w"))
    err = fails(capsys, ["--resume", finished_run])
    assert message in err and "run.json" in err


@pytest.mark.parametrize("where", ["middle", "last"])
def test_a_metrics_line_over_the_limit_is_called_too_long(finished_run, capsys, where):
    # a valid row of over 1 MiB was called "not a metrics row" (and, last, dropped as half-written)
    from harness import metrics
    path = os.path.join(finished_run, "metrics.jsonl")
    rows = open(path).read().splitlines(keepends=True)
    huge = json.dumps({"step": 3, "note": "x" * (2 * metrics.MAX_METRICS_LINE)}) + "\n"
    rows.insert(len(rows) if where == "last" else 1, huge)
    open(path, "w").writelines(rows)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert f"metrics.jsonl:{len(rows) if where == 'last' else 2}: a line of over 1048576 bytes" in err, err


def test_a_metrics_row_without_a_step_names_its_line(finished_run, capsys):
    with open(os.path.join(finished_run, "metrics.jsonl"), "a") as f:
        f.write('{"reward": 1}\n')
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "metrics.jsonl:" in err and 'integer "step"' in err


# --- 7. the math-verify helper dies with its parent -----------------------------------------------------------------
def test_the_math_helper_does_not_outlive_a_killed_trainer():
    pytest.importorskip("math_verify")
    code = ("import sys, time; sys.path.insert(0, %r); from tasks import _math; "
            "print(_math._running_helper().pid, flush=True); time.sleep(60)") % REPO
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    helper = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            state = open(f"/proc/{helper}/status").read().split("State:")[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        if state in ("gone", "Z"):  # Z: dead, waiting for init to collect it
            break
        time.sleep(0.1)
    assert state in ("gone", "Z"), f"the helper {helper} is still {state}"


# --- 8. bounded inputs ------------------------------------------------------------------------------------------------
def test_data_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    from tasks._data import load_splits, read_jsonl
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        start = time.time()
        with pytest.raises(ValueError, match="not a regular file"):
            load_splits(path, ("question",), "question")
        assert time.time() - start < 1
    long_line = tmp_path / "long.jsonl"
    long_line.write_bytes(b'{"question": "' + b"x" * (17 << 20) + b'"}\n')
    with pytest.raises(ValueError, match="long.jsonl:1: longer than 16 MiB"):
        read_jsonl(str(long_line), ("question",))


# --- 9. one line, the right code, at the right time -----------------------------------------------------------------
@pytest.mark.parametrize("flags,message", [
    (["--seed", "-1"], "--seed must lie in"),
    (["--seed", str(10**20)], "--seed must lie in"),
    (["--lopti-eta", "1.5"], "--lopti-eta must lie in [0, 1]"),
    (["--warm-start-target", "5"], "--warm-start-target must lie in [0, 1]"),
    (["--clip-high", "0"], "--clip-high must be > 0"),
    (["--kl-coef", "nan"], "argument --kl-coef: expected a finite number"),
    # numbers that ran into a traceback mid-run (nan weights) or built a model RoPE cannot rotate
    (["--kl-coef", "1e300"], "--kl-coef must lie in [0, 100]"),
    (["--lr", "1e30"], "--lr must lie in (0, 1]"),
    (["--weight-decay", "1e300"], "--lr x --weight-decay must be <= 1"),
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
    code = ("import sys; from harness import config\ntry:\n    config.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    proc = subprocess.run([sys.executable, "-c", code, "--output-dir", str(tmp_path), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "2"] and proc.stderr.startswith("train.py: error:")
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_conflicting_resume_flag_is_exit_1_before_torch_loads(finished_run):
    path = os.path.join(finished_run, "checkpoint-4", "run.json")  # a built-in task: "digits" is this process's own
    json.dump({**json.load(open(path)), "task": "countdown"}, open(path, "w"))
    code = ("import sys; from harness import config\ntry:\n    config.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    proc = subprocess.run([sys.executable, "-c", code, "--resume", finished_run, "--method", "grpo"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "1"] and "--method grpo conflicts" in proc.stderr


def test_cuda_on_a_cpu_torch_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = fails(capsys, ["--output-dir", str(tmp_path / "run"), "--device", "cuda", "--steps", "0"], code=2)
    assert "--device cuda: this torch sees no CUDA device" in err


def test_a_corrupt_checkpoint_model_is_exit_1(finished_run, capsys):
    path = os.path.join(finished_run, "checkpoint-4", "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "checkpoint-4" in err


def test_resuming_a_finished_run_says_there_is_nothing_to_do(finished_run, capsys):
    train.main(["--resume", finished_run, "--steps", "3"])
    assert "--steps 3 is reached: nothing to train" in capsys.readouterr().out


def test_resuming_an_older_checkpoint_with_nothing_to_train_changes_nothing(finished_run, capsys):
    # --resume RUN/checkpoint-2 --steps 2 used to say "nothing to train" and delete the metrics of steps 3-4, whose
    # checkpoint still exists, and point `latest` back at checkpoint-2.
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    train.main(["--resume", os.path.join(finished_run, "checkpoint-2"), "--steps", "2"])
    assert "nothing to train" in capsys.readouterr().out
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")


def test_a_refused_resume_leaves_latest_and_the_metrics_alone(finished_run, capsys):
    path = os.path.join(finished_run, "checkpoint-2", checkpoint.TRAINER_STATE)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "optimizer": {"state": {}, "param_groups": []}}, path)  # fits no model
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-2"), "--steps", "6"])
    assert "optimizer state does not fit" in err
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")


def test_an_optimizer_state_of_the_wrong_shapes_is_one_line(finished_run, capsys):
    # load_state_dict accepts it (same parameter count); the first optimizer step would then fail in a traceback
    path = os.path.join(finished_run, "checkpoint-4", checkpoint.TRAINER_STATE)
    state = torch.load(path, weights_only=True)
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"] = first["exp_avg"].reshape(-1)[:3].clone()
    torch.save(state, path)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "optimizer state does not fit this model" in err


@pytest.mark.parametrize("key, value", [("maximize", True), ("weight_decay", 0.5), ("betas", [0.5, 0.5]),
                                        ("eps", 1e-3), ("amsgrad", True)])
def test_an_optimizer_setting_in_the_checkpoint_never_overrides_the_runs(finished_run, capsys, key, value):
    # load_state_dict takes the file's param_groups: `maximize: true` trained by gradient ascent, with exit code 0
    path = os.path.join(finished_run, "checkpoint-4", checkpoint.TRAINER_STATE)
    state = torch.load(path, weights_only=True)
    state["optimizer"]["param_groups"][0][key] = value
    torch.save(state, path)
    before = open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert f"its optimizer's {key} is {value!r}" in err and "run.json" in err
    assert open(os.path.join(finished_run, "metrics.jsonl")).read() == before


def test_a_resume_whose_loggers_fail_has_changed_nothing(finished_run, capsys, monkeypatch):
    # Resuming checkpoint-2 of a 4-step run drops the rows of steps 3-4 and moves `latest`; a logger that fails to
    # open (a W&B run id it refuses, a full disk under tensorboard/) used to do so after those changes.
    from harness import report

    def refuse(*args, **kwargs):
        raise checkpoint.RunError("the logger refused")
    monkeypatch.setattr(report, "open_reporters", refuse)
    before = sorted(os.listdir(finished_run)), open(os.path.join(finished_run, "metrics.jsonl")).read()
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-2"), "--steps", "6"])
    assert "the logger refused" in err
    assert (sorted(os.listdir(finished_run)), open(os.path.join(finished_run, "metrics.jsonl")).read()) == before
    assert os.path.realpath(os.path.join(finished_run, "latest")).endswith("checkpoint-4")


def test_deeply_nested_json_in_run_json_is_one_line(finished_run, capsys):
    with open(os.path.join(finished_run, "checkpoint-4", "run.json"), "w") as f:
        f.write("[" * 100_000 + "]" * 100_000)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "run.json is unreadable" in err


# --- 10. writes stay inside the folder given -------------------------------------------------------------------------
def test_a_latest_pointing_into_another_folder_is_refused(finished_run, tmp_path, capsys):
    other = tmp_path / "other"
    run(other, "--steps", "2")
    latest = os.path.join(finished_run, "latest")
    os.remove(latest)
    os.symlink(os.path.join(other, "checkpoint-2"), latest)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "points outside its run folder" in err
    assert checkpoint.checkpoint_steps(str(other)) == [2] and not os.path.exists(other / "checkpoint-5")


def test_a_checkpoint_linked_in_from_another_run_is_refused(finished_run, tmp_path, capsys):
    # --resume RUN/checkpoint-6 where that folder is a link into another run's folder: the run would continue there
    other = tmp_path / "other"
    run(other, "--steps", "6", "--save-every", "6")
    os.symlink(os.path.join(other, "checkpoint-6"), os.path.join(finished_run, "checkpoint-6"))
    before = sorted(os.listdir(other)), open(other / "metrics.jsonl").read()
    err = fails(capsys, ["--resume", os.path.join(finished_run, "checkpoint-6"), "--steps", "8"])
    assert "outside the folder it stands in" in err
    assert (sorted(os.listdir(other)), open(other / "metrics.jsonl").read()) == before


def test_every_flag_appears_in_help_with_its_default():
    text = " ".join(config.build_parser().format_help().split())
    for name in ("--output-dir", "--seed", "--clip-low", "--overwrite", "--resume"):
        assert name in text
    assert "(default: runs/default)" in text and "(default: 0.2; paper: 0.2)" in text


@pytest.mark.parametrize("has_bf16,expected", [(True, "bf16"), (False, "fp32")], ids=["A100-like", "T4-like"])
def test_dtype_auto_picks_bf16_only_where_the_card_has_it(monkeypatch, capsys, has_bf16, expected):
    from harness import run
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a faked card on this CPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: has_bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Tesla T4")
    settled = run.hardware(config.Config())
    assert (settled.device, settled.dtype) == ("cuda", expected)
    assert ("Tesla T4 has no bf16: --dtype auto computes in fp32" in capsys.readouterr().out) == (not has_bf16)
    assert run.hardware(config.Config(dtype="bf16")).dtype == "bf16"  # asked for: kept


def test_a_setting_on_by_default_is_turned_off_by_its_no_flag():
    assert config.parse_args([]).fast is True and config.parse_args(["--no-fast"]).fast is False
    text = " ".join(config.build_parser().format_help().split())
    assert "--no-fast" in text
    # the defaults read right: the flag of a setting on by default turns it off; a store-true flag's is off
    assert "(default: on; this flag turns it off)" in text and "(default: True)" not in text
    assert re.search(r"--gradient-checkpointing [^-]*\(default: off", text) and "(default: False)" not in text


def test_a_missing_model_or_unreachable_hub_id_answers_before_torch_loads(tmp_path):
    code = ("import sys; from harness import config\ntry:\n    config.load(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code)")
    for model, message in [("./no/such/model", "model path does not exist"),
                           ("no-such-org/no-such-model", "not in the Hugging Face cache")]:
        proc = subprocess.run([sys.executable, "-c", code, "--output-dir", str(tmp_path), "--model", model], cwd=REPO,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")})
        assert proc.stdout.split() == ["False", "2"] and message in proc.stderr


def test_overwrite_also_deletes_the_old_runs_picture(finished_run):
    (open(os.path.join(finished_run, "metrics.png"), "wb")).write(b"\x89PNG old")
    run(finished_run, "--steps", "1", "--overwrite")
    assert not os.path.exists(os.path.join(finished_run, "metrics.png"))


def test_the_settings_line_names_ar_and_lopti(tmp_path, capsys):
    run(tmp_path / "run", "--steps", "1", "--alpha", "0.3", "--lopti-eta", "0.5")
    assert "method softmax, AR alpha 0.3, Lopti eta 0.5 (low-first), lr" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["/dev/zero", "fifo", "not json"])
def test_a_warm_start_cache_that_is_not_what_we_wrote_is_one_line(tmp_path, capsys, damage):
    # The cached warm start's info file is read only if it is a small regular file holding its keys: a link to
    # /dev/zero (which grew to 20 GB in 39 s), a FIFO (which hung) or garbage is one line naming it.
    cache = tmp_path / "cache"
    flags = ["--task", "countdown", *SMALL, "--warm-start-steps", "2", "--warm-start-cache", str(cache), "--steps", "1"]
    train.main([*flags, "--output-dir", str(tmp_path / "a")])
    [info] = glob.glob(str(cache / "warm_start-*" / "warm_start.json"))
    os.remove(info)
    if damage == "/dev/zero":
        os.symlink("/dev/zero", info)
    elif damage == "fifo":
        os.mkfifo(info)
    else:
        open(info, "w").write("{not json")
    err = fails(capsys, [*flags, "--output-dir", str(tmp_path / "b")])
    assert "warm_start.json" in err and "delete that warm-start folder" in err


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_warm_start_cache_whose_weights_are_cut_short_is_one_line(tmp_path, capsys, damage):
    # a truncated or empty model.safetensors in the cache was a safetensors traceback
    cache = tmp_path / "cache"
    flags = ["--task", "digits", *SMALL, "--warm-start-steps", "2", "--warm-start-cache", str(cache),
             "--steps", "1"]
    train.main([*flags, "--output-dir", str(tmp_path / "a")])
    [weights] = glob.glob(str(cache / "warm_start-*" / "model.safetensors"))
    data = open(weights, "rb").read()
    open(weights, "wb").write(data[:len(data) // 2] if damage == "truncated" else b"")
    err = fails(capsys, [*flags, "--output-dir", str(tmp_path / "b")])
    assert "could not load model" in err and "warm_start-" in err and "delete that warm-start folder" in err
    assert not os.path.exists(tmp_path / "b" / "metrics.jsonl")


@pytest.mark.parametrize("where", ["checkpoint", "warm start cache"])
@pytest.mark.parametrize("damage, message", [({"num_hidden_layers": 100_000}, "num_hidden_layers is 100000"),
                                             ({"num_hidden_layers": 300}, "asks for ~"),
                                             ({"hidden_size": -8}, "hidden_size is -8"),
                                             ({"vocab_size": "big"}, "vocab_size is 'big'"),
                                             ("nested", "config.json is not readable JSON")])
def test_a_config_that_asks_for_too_much_is_refused_before_anything_is_built(finished_run, tmp_path, capsys, where,
                                                                              damage, message):
    # num_hidden_layers: 100000 in a checkpoint's or a warm-start cache's config.json gave no answer in 90 s
    if where == "checkpoint":
        folder, argv = os.path.join(finished_run, "checkpoint-4"), ["--resume", finished_run, "--steps", "5"]
    else:
        cache = tmp_path / "cache"
        flags = ["--task", "digits", *SMALL, "--warm-start-steps", "2", "--warm-start-cache", str(cache), "--steps", "1"]
        train.main([*flags, "--output-dir", str(tmp_path / "a")])
        [folder] = glob.glob(str(cache / "warm_start-*"))
        argv = [*flags, "--output-dir", str(tmp_path / "b")]
    path = os.path.join(folder, "config.json")
    settings = json.load(open(path))
    if damage == "nested":
        open(path, "w").write("[" * 100_000 + "]" * 100_000)
    else:
        json.dump({**settings, **damage}, open(path, "w"))
    started = time.time()
    err = fails(capsys, argv, code=1)
    assert message in err and time.time() - started < 30, err


def test_a_stopped_run_is_told_to_resume_only_when_it_has_a_checkpoint(tmp_path):
    """A write that fails before the first checkpoint (a logger's full disk at step 1) cannot be resumed: the line
    says to run the command again; once a checkpoint exists it says --resume."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert checkpoint.then_resume(str(tmp_path)) == ", then run the command again (no checkpoint saved yet)"
    with pytest.raises(checkpoint.RunError, match="no checkpoint saved yet"):
        from harness.metrics import append_metrics
        append_metrics(str(tmp_path / "no-such-folder" / "metrics.jsonl"), {"step": 2})
    (tmp_path / "checkpoint-2").mkdir()
    os.symlink("checkpoint-2", tmp_path / "latest")
    assert checkpoint.then_resume(str(tmp_path)) == ", then continue with --resume"


# --- a step whose loss or gradient is not finite never reaches the weights (issue 61) ------------------------------
def strict_rows(path):
    def refuse(constant):
        raise ValueError(f"{constant} is not strict JSON")
    return [json.loads(line, parse_constant=refuse) for line in open(path)]


def test_a_step_with_a_nan_loss_is_not_taken_and_the_metrics_stay_strict_json(tmp_path, capsys, monkeypatch):
    # the nan step was taken: nan weights saved (which --resume then refused) and `NaN` written into metrics.jsonl
    from fast import update as fast_update  # the default run's update (train.update_batch's fast path)
    calls, policy_loss = [], fast_update.policy_loss

    def nan_in_step_2(*args, **kwargs):  # SMALL: one optimizer step, one micro-batch per RL step
        calls.append(1)
        loss, stats = policy_loss(*args, **kwargs)
        return (loss * float("nan"), stats) if len(calls) == 2 else (loss, stats)
    monkeypatch.setattr(fast_update, "policy_loss", nan_in_step_2)
    out = tmp_path / "run"
    run(out, "--steps", "3", "--save-every", "1", "--keep-checkpoints", "0")
    assert "step 2: 1 optimizer step(s) not taken: a gradient held nan or inf" in capsys.readouterr().out
    rows = [row for row in strict_rows(out / "metrics.jsonl") if not row.get("eval")]
    assert [(row["optimizer_steps"], row.get("skipped_steps")) for row in rows] == [(1, None), (0, 1), (1, None)]
    assert rows[1]["loss"] is None and rows[1]["grad_norm"] is None
    from safetensors.torch import load_file
    first, second = (load_file(out / f"checkpoint-{step}" / "model.safetensors") for step in (1, 2))
    assert all(torch.equal(first[key], second[key]) for key in first)  # step 2 changed nothing
    train.main(["--resume", str(out), "--steps", "4"])  # and the run goes on


def test_a_weight_that_is_not_finite_is_never_saved(tmp_path, finished_run):
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(checkpoint.RunError, match=r"step 6: the policy's weight 'weight' holds nan or inf, so no "
                                                  r"checkpoint-6 is written; --resume .* from checkpoint-4"):
        checkpoint.save_checkpoint(finished_run, 6, model, None, {}, {})
    assert checkpoint.checkpoint_steps(finished_run) == [2, 4]
    assert not os.path.lexists(f"{finished_run}/checkpoint-6.tmp")


# --- weights that are not all there, or not the checkpoint's own, are refused (issue 61) ---------------------------
def test_a_weight_file_copied_from_another_checkpoint_is_refused(finished_run, capsys):
    # checkpoint-2's model.safetensors copied into checkpoint-4: resumed as step 4 with step 2's weights, exit 0
    import shutil
    shutil.copyfile(f"{finished_run}/checkpoint-2/model.safetensors",
                    f"{finished_run}/checkpoint-4/model.safetensors")
    err = fails(capsys, ["--resume", f"{finished_run}/checkpoint-4", "--steps", "5"])
    assert "checkpoint-4/model.safetensors: is not the weight file this checkpoint saved at its step" in err
    assert "resume from checkpoint-2" in err


@pytest.mark.parametrize("where", ["checkpoint", "model"])
def test_a_weight_file_that_lacks_some_tensors_is_refused(finished_run, tmp_path, capsys, where):
    # a renamed key (a dropped layer alike) loaded as random weights, and the run exited 0
    from safetensors.torch import load_file, save_file
    folder = f"{finished_run}/checkpoint-4"
    if where == "model":
        import shutil
        folder = shutil.copytree(folder, tmp_path / "model")
    path = f"{folder}/model.safetensors"
    weights = load_file(path)
    renamed = sorted(key for key in weights if "mlp.up_proj" in key)[0]
    weights["renamed." + renamed] = weights.pop(renamed)
    save_file(weights, path, metadata={"format": "pt"})
    argv = ["--resume", folder, "--steps", "5"] if where == "checkpoint" else \
        ["--model", str(folder), "--task", "digits", "--output-dir", str(tmp_path / "fresh"), *SMALL, "--steps", "1"]
    err = fails(capsys, argv, code=1 if where == "checkpoint" else 2)
    assert f"its weight files lack 1 of the model's tensors ({renamed}: renamed or dropped)" in err


@pytest.mark.parametrize("sizes, message", [({"n_embd": 12288, "n_layer": 96, "n_head": 96}, "asks for ~232B"),
                                            ({"n_layer": 100_000}, "n_layer is 100000"),
                                            ({"n_positions": 0}, "n_positions is 0")])
def test_gpt2_style_size_names_are_checked_too(tmp_path, sizes, message):
    # n_embd / n_layer bypassed the check: a 7 MB folder asked for ~51 GB
    from harness.model import check_config_sizes
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 7_000_000)
    with pytest.raises(ValueError, match=message):
        check_config_sizes({"model_type": "gpt2", "n_inner": None, **sizes}, str(tmp_path), "gpt2-folder")
    check_config_sizes({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2}, str(tmp_path), "gpt2-folder")


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


@pytest.mark.parametrize("free, said", [(0, "disk full (0 bytes free); free some disk space"),
                                        (10**12, "[enforce fail at inline_container.cc:672]")])
def test_a_full_disk_inside_torch_save_is_said_so(tmp_path, monkeypatch, free, said):
    # it read "[enforce fail at inline_container.cc:672] . unexpected pos 960 vs 832"; with room left on the disk the
    # writer's own words stay (not a full disk: maybe a bug)
    import collections
    import shutil

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 960 vs 832")
    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(torch, "save", full)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1, 1, free))
    monkeypatch.setattr(checkpoint, "save_policy", lambda model, folder: None)
    tokenizer = type("Tokenizer", (), {"save_pretrained": lambda self, folder: None})()
    with pytest.raises(checkpoint.RunError) as error:
        checkpoint.save_checkpoint(str(tmp_path), 1, model, tokenizer, {}, {})
    assert f"could not write checkpoint {tmp_path}/checkpoint-1: {said}" in str(error.value)
    assert os.listdir(tmp_path) == []


def test_a_tensor_problem_names_the_type_with_its_article():
    assert checkpoint.tensor_problem(3, torch.float32) == "is an int, not a tensor"  # was "is a int"
    assert checkpoint.tensor_problem("x", torch.float32) == "is a str, not a tensor"
