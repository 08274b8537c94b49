"""Table 3, Lopti Fig. 1(d) / Fig. 3 and the seed comparison: hand-computed cases, limits and smoke runs.

The smoke runs use a randomly initialised tiny Llama (hidden 32, 1 layer) saved under tmp_path and a stub task whose
reward is the share of digits in the completion, so groups have reward variance without any training.
"""
import copy
import csv
import json
import math
import os
import subprocess
from types import SimpleNamespace

import pytest
import torch

import tasks
from experiments import lopti_token_stats, runs, table3_allocation
from lab import compare, seed_stats
from harness.model import load_policy
from harness.tiny import build_char_tokenizer, build_tiny_model, prompt_style
from rollout import token_logprobs
from softmax_grpo import group_advantages
from tests.stubs import SMALL_TRAIN, DigitsTask

pytestmark = pytest.mark.usefixtures("digits_task")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random-init tiny model saved as a save_pretrained folder (what train.py's checkpoints are)."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    tokenizer = build_char_tokenizer(tasks.COMPACT_ALPHABET)
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------------------
# Table 3

def test_bins_follow_the_papers_edges():
    p = torch.tensor([0.0, 0.0999, 0.1, 0.4999, 0.5, 0.8999, 0.9, 1.0])
    assert table3_allocation.bin_index(p).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_allocation_hand_computed_grpo_splits_evenly_softmax_favours_the_hard_prompt():
    # M = 4, binary: a hard prompt (k = 1), an easy one (k = 3), an unsolved one (k = 0, A = 0: no budget)
    rewards = torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 1, 0], [0.0, 0, 0, 0]])
    lengths = torch.tensor([[2.0, 1, 1, 1], [1.0, 1, 1, 1], [5.0, 5, 5, 5]])
    tau = 0.5
    rows = table3_allocation.allocation_table(rewards, 1.0, lengths, tau=tau)
    share = {(r["method"], r["bin"]): r["share"] for r in rows}
    # GRPO, k = 1: mean 1/4, unbiased std sqrt((9/16 + 3/16) / 3) = 1/2 -> A = (3/2, -1/2, -1/2, -1/2);
    # budget sum |A| len = 3/2*2 + 3/2 = 4.5. k = 3 mirrors it: A = (1/2, 1/2, 1/2, -3/2), all lengths 1 -> 3.
    assert share[("grpo", "[.1,.5)")] == pytest.approx(4.5 / 7.5, abs=1e-5)
    assert share[("grpo", "[.5,.9)")] == pytest.approx(3.0 / 7.5, abs=1e-5)
    # SoftmaxGRPO, c = e^(1/tau): k = 1 -> A_s = 4c/(c+3) - 1, A_f = 4/(c+3) - 1; k = 3 -> A_s = 4c/(3c+1) - 1, ...
    c = math.exp(1 / tau)
    hard = abs(4 * c / (c + 3) - 1) * 2 + 3 * abs(4 / (c + 3) - 1)
    easy = 3 * abs(4 * c / (3 * c + 1) - 1) + abs(4 / (3 * c + 1) - 1)
    assert share[("softmax", "[.1,.5)")] == pytest.approx(hard / (hard + easy), abs=1e-5)
    assert share[("softmax", "[.1,.5)")] > share[("grpo", "[.1,.5)")]  # the paper's point: hard prompts get more
    assert share[("grpo", "[0,.1)")] == share[("softmax", "[0,.1)")] == 0.0
    assert {r["prompts"] for r in rows if r["bin"] == "[.9,1]"} == {0}


def test_all_equal_rewards_have_no_budget_to_share():
    with pytest.raises(ValueError, match="budget 0"):
        table3_allocation.allocation_table(torch.ones(3, 4), 1.0, torch.ones(3, 4), tau=0.1)


def test_table3_script_shares_sum_to_one_for_both_methods_and_budgets(checkpoint, tmp_path, capsys):
    table3_allocation.main(["--checkpoint", checkpoint, "--task", "digits", "--num-prompts", "12", "-M", "4",
                            "--max-new-tokens", "6", "--exact", "--output-dir", str(tmp_path)])
    rows = read_csv(tmp_path / "table3_allocation.csv")
    assert list(rows[0]) == ["bin", "prompts", "method", "budget", "share"]
    assert {(r["method"], r["budget"]) for r in rows} == {
        (m, b) for m in ("grpo", "softmax") for b in ("tokens", "exact")}
    for method in ("grpo", "softmax"):
        for budget in ("tokens", "exact"):
            mine = [r for r in rows if r["method"] == method and r["budget"] == budget]
            assert [r["bin"] for r in mine] == list(table3_allocation.BIN_NAMES)
            assert sum(float(r["share"]) for r in mine) == pytest.approx(1.0, abs=1e-5)
            assert sum(int(r["prompts"]) for r in mine) == 12
    assert "(compact style)" in capsys.readouterr().out  # the char vocabulary was recognised


def test_exact_budget_is_linear_in_the_advantages(checkpoint):
    model, tokenizer = load_policy(checkpoint)
    style = prompt_style(tokenizer)
    task = DigitsTask()
    torch.manual_seed(0)
    chunks, rewards = table3_allocation.sample_groups(model, tokenizer, task, task.examples("test", 3, 0), 4,
                                                      style=style, max_new_tokens=5, batch_prompts=2)
    advantages = torch.tensor([[1.0, -1, 0.5, -0.5], [0.0, 0, 0, 0], [2.0, 0, 0, -2]])
    budget = table3_allocation.exact_budget(model, chunks, advantages, 4, total_tokens=10.0)
    assert budget[1] == 0 and (budget[[0, 2]] > 0).all()
    assert torch.allclose(table3_allocation.exact_budget(model, chunks, -3 * advantages, 4, total_tokens=10.0),
                          3 * budget, rtol=1e-4)


# ------------------------------------------------------------------------------------------------------------
# Lopti Fig. 1(d) and Fig. 3

def test_logit_gradient_norm_equals_autograd_and_respects_prop_4_2():
    torch.manual_seed(0)
    B, P, T, V = 3, 2, 4, 7
    logits = torch.randn(B, P + T, V) * 2
    input_ids = torch.randint(0, V, (B, P + T))
    def stub_model(input_ids, logits_to_keep, **unused):  # a "model" with fixed logits [B, P+T, V]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:])
    norms = lopti_token_stats.logit_gradient_norms(stub_model, input_ids, torch.ones(B, P + T), torch.ones(B, T),
                                                   micro_batch=B)
    z = logits[:, P - 1:-1, :].clone().requires_grad_(True)  # position t predicts token t + 1
    targets = input_ids[:, P:]
    torch.log_softmax(z, -1).gather(-1, targets[..., None]).sum().backward()
    assert torch.allclose(norms, z.grad.norm(dim=-1), atol=1e-5)
    p = torch.softmax(z.detach(), -1).gather(-1, targets[..., None]).squeeze(-1)
    assert (norms >= math.sqrt(V / (V - 1)) * (1 - p) - 1e-5).all() and (norms <= math.sqrt(2) * (1 - p) + 1e-5).all()


def test_probability_groups_quantile_counts_and_fixed_edges():
    probs = torch.tensor([[0.9, 0.1, 0.1, 0.1, 0.5], [0.3, 0.99, 0.7, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    groups = lopti_token_stats.probability_groups(probs, mask, "quantile")
    assert groups[1, 4] == -1
    assert [int((groups == q).sum()) for q in range(4)] == [3, 2, 2, 2]  # 9 tokens, ties split by position
    assert all(probs[groups == q].max() <= probs[groups == q + 1].min() for q in range(3))
    fixed = lopti_token_stats.probability_groups(probs, mask, "fixed")
    assert fixed[0].tolist() == [3, 0, 0, 0, 2] and fixed[1, :4].tolist() == [1, 3, 2, 0]


def _batch(checkpoint, num_prompts=6, M=4):
    model, tokenizer = load_policy(checkpoint)
    style = prompt_style(tokenizer)
    task = DigitsTask()
    torch.manual_seed(1)
    examples = task.examples("test", num_prompts, 1)
    [(rollouts, _)], rewards = table3_allocation.sample_groups(model, tokenizer, task, examples, M, style=style,
                                                               max_new_tokens=6, batch_prompts=num_prompts)
    batch = (rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask)
    with torch.no_grad():
        old = token_logprobs(model, *batch)
    return model, batch, group_advantages(rewards, "grpo").view(-1), old


def test_one_update_lr_zero_moves_nothing_and_a_small_step_improves_the_surrogate(checkpoint):
    model, batch, advantages, old = _batch(checkpoint)
    assert advantages.abs().sum() > 0
    still = lopti_token_stats.one_update(model, batch, advantages, old, alpha=0.3, eta=0.5, lr=0.0)
    with torch.no_grad():
        assert torch.equal(token_logprobs(still, *batch), old)
    # first order: one small ascent step on sum_t A log pi raises it (token-mean surrogate of the update)
    for setting in lopti_token_stats.UPDATES.values():
        moved = lopti_token_stats.one_update(copy.deepcopy(model), batch, advantages, old,
                                             lr=1e-4, **setting)
        with torch.no_grad():
            new = token_logprobs(moved, *batch)
        assert ((new - old) * advantages[:, None] * batch[2]).sum() > 0


def test_lopti_script_writes_both_tables(checkpoint, tmp_path):
    fig1d, fig3 = lopti_token_stats.main(["--checkpoint", checkpoint, "--task", "digits", "--num-prompts", "8",
                                          "-M", "4", "--max-new-tokens", "6", "--param-grad",
                                          "--output-dir", str(tmp_path)])
    rows = read_csv(tmp_path / "fig1d_grad_norm.csv")
    assert list(rows[0]) == ["seed", "group", "p_min", "p_max", "tokens", "mean_p_old", "mean_norm", "mean_adv_x_norm",
                             "share_of_sum", "param_grad_norm"]
    assert [int(r["group"]) for r in rows] == [1, 2, 3, 4]
    assert sum(float(r["share_of_sum"]) for r in rows) == pytest.approx(1.0, abs=1e-4)
    counts = [int(r["tokens"]) for r in rows]
    assert max(counts) - min(counts) <= 1 and all(float(r["param_grad_norm"]) >= 0 for r in rows)
    table = read_csv(tmp_path / "fig3_prob_rise.csv")
    assert list(table[0]) == ["seed", "method", "group", "pos_tokens", "pos_rose_share", "neg_tokens", "neg_fell_share",
                              "mean_delta_logprob_pos"]
    assert {(r["method"], int(r["group"])) for r in table} == {
        (m, q) for m in ("grpo", "ar", "lopti", "ar+lopti") for q in (1, 2, 3, 4)}
    assert all(int(r[f"{s}_tokens"]) == 0 or 0.0 <= float(r[f"{s}_{k}_share"]) <= 1.0
               for r in table for s, k in (("pos", "rose"), ("neg", "fell")))
    # the same rollouts and groups for every method: identical token counts
    assert len({tuple(int(r["pos_tokens"]) for r in table if r["method"] == m) for m in lopti_token_stats.UPDATES}) == 1


def test_fig3_over_seeds_is_the_mean_and_std_of_the_per_seed_shares(checkpoint, tmp_path):
    """--seeds 0,1 with a {seed} checkpoint pattern: each seed measured on its own checkpoint, then per (method,
    group) the mean and sample std of the two seeds' shares, recomputed here from the per-seed CSV."""
    pattern = checkpoint.replace("tiny", "{seed}")
    for seed in (0, 1):
        os.symlink(checkpoint, pattern.format(seed=seed))
    lopti_token_stats.main(["--checkpoint", pattern, "--seeds", "0,1", "--task", "digits", "--num-prompts", "8",
                            "-M", "4", "--max-new-tokens", "6", "--output-dir", str(tmp_path)])
    per_seed = read_csv(tmp_path / "fig3_prob_rise.csv")
    assert {r["seed"] for r in per_seed} == {"0", "1"}
    # different prompts per seed: the token counts differ somewhere
    assert [r["pos_tokens"] for r in per_seed if r["seed"] == "0"] != [r["pos_tokens"] for r in per_seed
                                                                        if r["seed"] == "1"]
    summary = read_csv(tmp_path / "fig3_prob_rise_summary.csv")
    assert len(summary) == 4 * 4
    for row in summary:
        shares = [float(r["pos_rose_share"]) for r in per_seed
                  if (r["method"], r["group"]) == (row["method"], row["group"]) and r["pos_rose_share"] != "nan"]
        assert int(row["pos_rose_share_seeds"]) == len(shares)
        if len(shares) == 2:
            assert float(row["pos_rose_share_mean"]) == pytest.approx(sum(shares) / 2, abs=1e-5)
            assert float(row["pos_rose_share_sd"]) == pytest.approx(abs(shares[0] - shares[1]) / math.sqrt(2),
                                                                    abs=1e-5)
        grpo = {r["seed"]: float(r["pos_rose_share"]) for r in per_seed
                if (r["method"], r["group"]) == ("grpo", row["group"]) and r["pos_rose_share"] != "nan"}
        own = {r["seed"]: float(r["pos_rose_share"]) for r in per_seed
               if (r["method"], r["group"]) == (row["method"], row["group"]) and r["pos_rose_share"] != "nan"}
        differences = [own[s] - grpo[s] for s in own if s in grpo]  # paired by seed: the same rollouts
        if differences:
            assert float(row["pos_rose_share_minus_grpo_mean"]) == pytest.approx(sum(differences) / len(differences),
                                                                                 abs=1e-5)
        if row["method"] == "grpo" and differences:
            assert float(row["pos_rose_share_minus_grpo_mean"]) == 0.0


# ------------------------------------------------------------------------------------------------------------
# compare.py

def test_mean_std_and_paired_summary():
    assert seed_stats.mean_std([0.1, 0.3]) == f"0.200 +- {math.sqrt(0.02):.3f}"
    runs = [{"config": c, "seed": s, "before_pass@1": 0.1, "after_pass@1": a}
            for c, s, a in [("a", 0, 0.2), ("a", 1, 0.4), ("b", 0, 0.5), ("b", 1, 0.5)]]
    summary = compare.summarize(runs, ["a", "b"])
    assert summary[1]["vs_first"] == pytest.approx([0.3, 0.1]) and summary[0]["vs_first"] == [0.0, 0.0]
    assert summary[1]["delta"] == pytest.approx([0.4, 0.4])


def test_compare_two_steps_two_seeds(tmp_path, capsys):
    out = str(tmp_path / "cmp")
    compare.main(["--preset", "countdown", "--seeds", "0,1", "--output-dir", out, "--task", "digits", *SMALL_TRAIN,
                  "--steps", "2"])
    runs = read_csv(os.path.join(out, "countdown_runs.csv"))
    assert {(r["config"], r["seed"]) for r in runs} == {(c, s) for c in ("grpo", "softmax") for s in ("0", "1")}
    assert {"before_pass@1", "after_pass@1", "after_reward", "seconds", "argv"} <= set(runs[0])
    for seed in ("0", "1"):  # paired design: both configs of a seed start from the same policy and eval prompts
        assert len({r["before_pass@1"] for r in runs if r["seed"] == seed}) == 1
    assert "--method softmax" in next(r["argv"] for r in runs if r["config"] == "softmax")
    summary = read_csv(os.path.join(out, "countdown_summary.csv"))
    assert [r["config"] for r in summary] == ["grpo", "softmax"] and "after_std" in summary[0]
    printed = capsys.readouterr().out
    assert "| softmax | 2 |" in printed and "+-" in printed


def test_compare_reuses_a_finished_run_only_with_the_same_flags(tmp_path, capsys):
    out = str(tmp_path / "cmp")
    flags = ["--preset", "countdown", "--configs", "grpo", "--output-dir", out, "--task", "digits", *SMALL_TRAIN,
             "--steps", "2", "--pass-k", "off"]
    compare.main([*flags, "--seeds", "0"])
    first = read_csv(os.path.join(out, "countdown_runs.csv"))
    capsys.readouterr()
    compare.main([*flags, "--seeds", "0,1"])  # a seed more: seed 0 is read back, not trained again
    printed = capsys.readouterr().out
    assert printed.count("reusing the finished run") == 1 and "1 finished runs reused" in printed
    grown = read_csv(os.path.join(out, "countdown_runs.csv"))
    assert [r["seed"] for r in grown] == ["0", "1"] and [r["reused"] for r in grown] == ["True", "False"]
    assert {k: grown[0][k] for k in ("before_pass@1", "after_pass@1", "after_reward")} == \
        {k: first[0][k] for k in ("before_pass@1", "after_pass@1", "after_reward")}
    compare.main([*flags, "--seeds", "0", "--lr", "0.001"])  # another flag value: trained again
    assert "reusing" not in capsys.readouterr().out


def test_compare_trains_again_a_run_that_other_code_trained(tmp_path, capsys):
    # each run records the commit that trained it (code.json); a run from other code is not read back (issue 38)
    out = str(tmp_path / "cmp")
    flags = ["--preset", "countdown", "--configs", "grpo", "--output-dir", out, "--task", "digits", *SMALL_TRAIN,
             "--steps", "2", "--pass-k", "off", "--seeds", "0"]
    compare.main(flags)
    code = os.path.join(out, "countdown", "grpo-seed0", runs.CODE_FILE)
    assert json.load(open(code))["commit"] == runs.code_commit()
    json.dump({"commit": "0" * 40}, open(code, "w"))  # as if trained by a commit this checkout does not have
    capsys.readouterr()
    compare.main(flags)
    printed = capsys.readouterr().out
    assert "not reusing the finished run" in printed and "reusing the finished run in" not in printed.replace(
        "not reusing the finished run in", "")
    os.remove(code)  # a run from before commits were recorded: trained again too
    compare.main(flags)
    assert "not reusing the finished run" in capsys.readouterr().out


def test_same_code_means_no_python_file_changed_between_the_commits(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git("add", "-A"), git("commit", "-qm", "code")
    first = git("rev-parse", "HEAD")
    (repo / "notes.md").write_text("a docs-only commit\n")
    git("add", "-A"), git("commit", "-qm", "docs")
    docs_only = git("rev-parse", "HEAD")
    (repo / "a.py").write_text("x = 2\n")
    git("add", "-A"), git("commit", "-qm", "code again")
    changed = git("rev-parse", "HEAD")
    monkeypatch.setattr(runs, "REPO", str(repo))
    assert runs.code_commit() == changed
    assert runs.same_code(first, docs_only) and not runs.same_code(first, changed)
    assert not runs.same_code("unknown", "unknown") and not runs.same_code("f" * 40, changed)
    (repo / "a.py").write_text("x = 3\n")  # an uncommitted edit: its own string, equal only to itself
    dirty = runs.code_commit()
    assert dirty.startswith(changed + "-dirty-") and runs.same_code(dirty, runs.code_commit())
    assert not runs.same_code(changed, dirty)


def test_countdown3_preset_ends_with_table3_on_every_final_policy(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(compare.PRESETS, "digits-table3", dict(task="digits", shared=[], configs={
        "grpo": ["--method", "grpo"], "softmax": ["--method", "softmax"]}, table3=True))
    out = str(tmp_path / "cmp")
    compare.main(["--preset", "digits-table3", "--seeds", "0,1", "--output-dir", out, *SMALL_TRAIN, "--steps", "1",
                  "--pass-k", "off"])
    rows = read_csv(os.path.join(out, "digits-table3_table3.csv"))
    assert len(rows) == 2 * 2 * 4  # configs x seeds x bins
    for config in ("grpo", "softmax"):
        for seed in ("0", "1"):
            own = [r for r in rows if (r["config"], r["seed"]) == (config, seed)]
            assert [r["bin"] for r in own] == list(table3_allocation.BIN_NAMES)
            for key in ("share_grpo_advantages", "share_softmax_advantages"):
                assert sum(float(r[key]) for r in own) == pytest.approx(1.0, abs=1e-3)
    assert "hardest bin [0,.1), policies trained with softmax" in capsys.readouterr().out


def test_lopti_preset_ends_with_fig3_over_its_seeds(tmp_path, monkeypatch):
    monkeypatch.setitem(compare.PRESETS, "digits-lopti", dict(task="digits", shared=["--method", "grpo"], configs={
        "grpo": [], "lopti": ["--lopti-eta", "0.5"]}, fig3=True))
    out = str(tmp_path / "cmp")
    compare.main(["--preset", "digits-lopti", "--seeds", "0,1", "--output-dir", out, *SMALL_TRAIN, "--steps", "1",
                  "--pass-k", "off"])
    summary = read_csv(os.path.join(out, "digits-lopti_fig3", "fig3_prob_rise_summary.csv"))
    assert {r["method"] for r in summary} == {"grpo", "ar", "lopti", "ar+lopti"}
    per_seed = read_csv(os.path.join(out, "digits-lopti_fig3", "fig3_prob_rise.csv"))
    assert {r["seed"] for r in per_seed} == {"0", "1"}


def test_compare_shares_one_warm_start_per_seed(tmp_path, capsys):
    out = str(tmp_path / "cmp")
    compare.main(["--preset", "countdown", "--seeds", "3", "--output-dir", out, "--task", "digits", *SMALL_TRAIN,
                  "--warm-start-steps", "2", "--steps", "1"])  # the later flag wins
    caches = os.listdir(os.path.join(out, "warm_start"))
    assert len(caches) == 1 and caches[0].startswith("warm_start-digits-h32-l1-")
    assert os.path.exists(os.path.join(out, "warm_start", caches[0], "warm_start.json"))
    printed = capsys.readouterr().out
    assert printed.count("warm start step 2") == 1 and printed.count("warm start: loaded") == 1  # trained once
