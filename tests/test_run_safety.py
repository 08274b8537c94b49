"""A run that cannot be hijacked, overwritten or lost: each case below broke the run lifecycle before, as an attacker
or a careless user would meet it. Every failure is one line naming the file, flag or process, with the right exit
code (2: a flag, 1: the run's files)."""
import glob
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from harness import checkpoint, files
from harness import config
from harness.manifest import file_sha256
import train
import tasks
from tests.run_cli import fails, finished_run, run  # noqa: F401 (finished_run: a fixture)
from tests.stubs import SMALL_TRAIN as SMALL, DigitsTask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("digits_task")


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
    (lambda f: (os.remove(f / "tokenizer_config.json"), os.symlink("/proc/self/status", f / "tokenizer_config.json")),
     "tokenizer_config.json is not a regular file of at most"),  # 381f0cf: a /proc file's size is 0
    (lambda f: (os.remove(f / "model.safetensors"), os.mkfifo(f / "shard"), (f / "model.safetensors.index.json")
                .write_text('{"weight_map": {"lm_head.weight": "shard"}}')),  # 381f0cf: the loader hung on it
     "its weights name 'shard', which is a FIFO (named pipe)"),
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
    listed = os.path.join(checkpoint_dir, "manifest.json")  # and its manifest.json says so
    json.dump({"sha256": {**json.load(open(listed))["sha256"], "run.json": file_sha256(path)}}, open(listed, "w"))
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


def test_a_corrupt_checkpoint_model_is_exit_1(finished_run, capsys):
    path = os.path.join(finished_run, "checkpoint-4", "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "checkpoint-4" in err


def test_deeply_nested_json_in_run_json_is_one_line(finished_run, capsys):
    with open(os.path.join(finished_run, "checkpoint-4", "run.json"), "w") as f:
        f.write("[" * 100_000 + "]" * 100_000)
    err = fails(capsys, ["--resume", finished_run, "--steps", "5"])
    assert "run.json is unreadable" in err


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


# --- a step whose loss or gradient is not finite never reaches the weights (issue 61) ------------------------------
def strict_rows(path):
    def refuse(constant):
        raise ValueError(f"{constant} is not strict JSON")
    return [json.loads(line, parse_constant=refuse) for line in open(path)]


def test_a_step_with_a_nan_loss_is_not_taken_and_the_metrics_stay_strict_json(tmp_path, capsys, monkeypatch):
    # the nan step was taken: nan weights saved (which --resume then refused) and `NaN` written into metrics.jsonl
    calls, policy_loss = [], train.policy_loss

    def nan_in_step_2(*args, **kwargs):  # SMALL: one optimizer step, one micro-batch per RL step
        calls.append(1)
        loss, stats = policy_loss(*args, **kwargs)
        return (loss * float("nan"), stats) if len(calls) == 2 else (loss, stats)
    monkeypatch.setattr(train, "policy_loss", nan_in_step_2)
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
    with pytest.raises(files.RunError, match=r"step 6: the policy's weight 'weight' holds nan or inf, so no "
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


def test_a_tensor_problem_names_the_type_with_its_article():
    assert checkpoint.tensor_problem(3, torch.float32) == "is an int, not a tensor"  # was "is a int"
    assert checkpoint.tensor_problem("x", torch.float32) == "is a str, not a tensor"
