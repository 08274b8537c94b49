"""Issue 30's scripts, each on a tiny setting (what the papers' referees asked; numbers: lab/referees.md).

eq4_monte_carlo: the simulated mean against the exact omega within a derived tolerance, and the same data rejecting
a wrong weight; referee_tuning: the grid's bookkeeping by hand, and the sweep end to end on a very small run."""
import csv
import os

import pytest

from experiments import eq4_monte_carlo

from lab import referee_tuning
from softmax_grpo import grpo_prompt_weight
from tests.stubs import SMALL_TRAIN


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------------------
# item 4: Eq. (4) by Monte Carlo

def test_eq4_monte_carlo_mean_matches_the_exact_weight_and_rejects_a_wrong_one(tmp_path, one_thread):
    """Under Eq. (4) each point's z = (MC mean - omega) / SE is ~N(0, 1); 9 points x 2 configs at |z| < 4.5 fail
    by chance with probability < 18 * 7e-6 (and the seed is fixed). GRPO's weight on the same draws must be far off:
    the check can fail."""
    rows = eq4_monte_carlo.main(["--configs", "8:0.1,4:1.0", "--groups", "4000", "--points", "9",
                                 "--output-dir", str(tmp_path)])
    assert len(rows) == 18 and all(abs(r["z"]) < 4.5 for r in rows)
    assert len(read_csv(tmp_path / "eq4_monte_carlo.csv")) == 18
    wrong = [abs(r["mc_mean"] - grpo_prompt_weight(r["p"], r["M"])) / r["mc_se"] for r in rows if r["M"] == 8]
    assert max(wrong) > 10  # M = 8, tau = 0.1 at small p: omega ~ 6, GRPO's ~ 2.4


def test_eq4_group_update_is_the_score_formula_by_hand(one_thread):
    """One group's autograd update equals (1/M) sum_i A_i (y_i - p) written out (the score of a Bernoulli logit)."""
    import torch

    from softmax_grpo import group_advantages
    g = torch.Generator().manual_seed(3)
    updates = eq4_monte_carlo.group_updates(0.3, 4, 0.5, 5, g)
    g = torch.Generator().manual_seed(3)
    answers = (torch.rand(5, 4, generator=g, dtype=torch.float64) < 0.3).double()
    by_hand = (group_advantages(answers, "softmax", tau=0.5).double() * (answers - 0.3)).mean(1)
    torch.testing.assert_close(updates, by_hand)


def test_eq4_bad_configs_are_one_line(capsys):
    with pytest.raises(SystemExit):
        eq4_monte_carlo.main(["--configs", "8-0.1"])
    assert "--configs" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------
# item 1: the tuning grid

def test_tuning_grid_has_the_same_budget_in_every_cell():
    configs = referee_tuning.compare.PRESETS["countdown3-tuning"]["configs"]
    assert len(configs) == 3 + 3 * 4
    for name, flags in configs.items():
        M, prompts = int(flags[flags.index("-M") + 1]), int(flags[flags.index("--prompts-per-step") + 1])
        assert M * prompts == 512, name
        assert referee_tuning.cell_of(name)[1] == M


def test_tuning_best_cells_and_paired_difference_by_hand(capsys):
    runs = [{"config": c, "seed": s, "after_pass@1": v} for c, vals in
            [("grpo-M8", [0.10, 0.20]), ("grpo-M4", [0.15, 0.16]), ("softmax-M8-tau0.1", [0.30, 0.10]),
             ("softmax-M4-tau1.0", [0.40, 0.30])] for s, v in enumerate(vals)]
    cells = referee_tuning.grid(runs)
    assert referee_tuning.best(cells, "softmax", "after_pass@1")["config"] == "softmax-M4-tau1.0"
    assert referee_tuning.best(cells, "grpo", "after_pass@1")["config"] == "grpo-M4"  # 0.155 > 0.150
    a, b = (referee_tuning.best(cells, m, "after_pass@1") for m in ("softmax", "grpo"))
    assert referee_tuning.paired(a, b, "after_pass@1") == pytest.approx([0.25, 0.14])
    referee_tuning.report(cells, "after_pass@1", total=30)
    out = capsys.readouterr().out
    assert "8 of 30 runs done" in out and "softmax-M4-tau1.0) - best GRPO (grpo-M4)" in out and "+0.195" in out


def test_tuning_grid_from_its_shipped_rows_uses_only_the_named_cpus(tmp_path, monkeypatch, capsys):
    from lab import reproduce
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    monkeypatch.setattr(referee_tuning, "FIGURE", str(tmp_path / "grid.png"))
    for machine, shift in (("CPU A, avx512, 2 cores", 0.0), ("CPU B, avx2, 2 cores", 0.5)):
        for seed, (grpo, softmax) in enumerate([(0.10, 0.30), (0.20, 0.10)]):
            made = {"commit": "c", "date": "d", "load": "1", "machine": machine}
            reproduce.ship(f"countdown3-tuning-grpo-M8-seed{seed}", {"after_pass@1": grpo + shift}, made)
            reproduce.ship(f"countdown3-tuning-softmax-M8-tau0.1-seed{seed}", {"after_pass@1": softmax + shift}, made)
    cells = referee_tuning.main(["--shipped", "CPU A"])
    assert [(c["config"], c["after_pass@1"]) for c in cells] == [("grpo-M8", [0.10, 0.20]),
                                                                 ("softmax-M8-tau0.1", [0.30, 0.10])]
    assert "4 of 45 runs done" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"^lab.referee_tuning: error: no run of the grid was shipped from a CPU "
                       r"named 'CPU C'; from CPU A, avx512 and CPU B, avx2 \(--shipped NAME reads one\)$"):
        referee_tuning.main(["--shipped", "CPU C"])  # one line: where the rows are


def test_tuning_sweep_end_to_end_then_summary_only(tmp_path, capsys, one_thread):
    out = str(tmp_path)
    referee_tuning.main(["--seeds", "0", "--output-dir", out, "--configs", "grpo-M8,softmax-M4-tau1.0", "--pass-k",
                         "1,4", *SMALL_TRAIN, "--eval-size", "2", "--steps", "1"])
    rows = read_csv(os.path.join(out, "countdown3-tuning_grid.csv"))
    assert [r["config"] for r in rows] == ["grpo-M8", "softmax-M4-tau1.0"]
    assert "2 of 2 runs done" in capsys.readouterr().out
    referee_tuning.main(["--seeds", "0", "--output-dir", out, "--summary-only"])
    assert "2 of 15 runs done" in capsys.readouterr().out  # the whole grid's count without --configs


# ------------------------------------------------------------------------------------------------------------
# items 5-7: the Lopti referee's quartile measurements

def test_quartile_gradients_add_up_to_train_py_gradient_with_kl(one_thread):
    """sum_q G_q must be -grad of ppo.policy_loss (token-mean surrogate + beta k3) on the same on-policy batch: the
    weights w = A + beta (pi_ref / pi - 1) are that loss's coefficients of grad log pi (a sign slip fails here)."""
    import copy

    import torch

    from lab import referee_lopti
    from experiments.lopti_token_stats import probability_groups
    from ppo import policy_loss
    from rollout import token_logprobs
    from tests.stubs import tiny_policy_and_rollouts
    _, model, rollouts = tiny_policy_and_rollouts()
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.2 * torch.randn_like(p))
    batch = (rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask)
    mask = batch[2].float()
    advantages = torch.tensor([1.0, -0.5, 0.0, -0.5, 0.3, 0.3, -0.6, 0.0])
    with torch.no_grad():
        logprobs, ref_logprobs = token_logprobs(model, *batch), token_logprobs(ref, *batch)
    weights = referee_lopti.token_weights(advantages, logprobs, ref_logprobs, mask, 0.5)
    groups = probability_groups(logprobs.exp(), mask.bool())
    sums = referee_lopti.quartile_gradients(model, batch, weights, groups, temperature=1.0, micro_batch=3)
    current = token_logprobs(model, *batch)
    loss, _ = policy_loss(current, current.detach(), advantages, mask, ref_logprobs=ref_logprobs, kl_coef=0.5)
    expected = -torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])
    torch.testing.assert_close(sums.sum(0), expected, rtol=1e-4, atol=1e-7)
    assert (sums.norm(dim=1) > 0).all()


def test_clipped_tokens_and_their_weight_by_hand():
    """Item 5's clipped case on a hand-built batch (clip 0.2 / 0.28, dual clip c = 3). Row 0 has A = +1, row 1
    A = -2; pi_old = 0.5 everywhere and pi = ratio * pi_old. Token by token, with l = max(-A r, -A clamp(r)):
      row 0: r = 1.0 inside, w = A r = 1; r = 1.5 > 1.28 with A > 0: clipped high, w = 0; r = 0.5 < 0.8 but A > 0,
             so max(-0.5, -0.8) = -0.5 is the unclipped term: inside, w = 0.5; the 4th token is padding.
      row 1: r = 0.5 < 0.8 with A < 0: clipped low, w = 0; r = 1.1 inside, w = -2.2; r = 4 > c = 3: the dual clip
             caps the loss at -A c, w = 0; r = 2 > 1.28 but A < 0 is not clipped (above 1 + clip_high), w = -4.
    Without the dual clip the r = 4 token is inside with w = -8. With pi_ref = 2 pi and beta = 0.5 every valid
    token adds beta (pi_ref / pi - 1) = 0.5, clipped or not (the KL term is not clipped)."""
    import math

    import torch

    from lab.referee_lopti_offpolicy import loss_token_weights, trust_region_masks
    ratio = torch.tensor([[1.0, 1.5, 0.5, 1.0], [0.5, 1.1, 4.0, 2.0]], dtype=torch.float64)
    old = torch.full_like(ratio, math.log(0.5))
    new = old + ratio.log()
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    clip = dict(clip_low=0.2, clip_high=0.28)
    masks = trust_region_masks(ratio, advantages, mask, **clip, dual_clip=3.0)
    where = {name: sorted(map(tuple, m.nonzero().tolist())) for name, m in masks.items()}
    assert where == {"low": [(1, 0)], "high": [(0, 1)], "dual": [(1, 2)], "inside": [(0, 0), (0, 2), (1, 1), (1, 3)],
                     "neg_above": [(1, 3)]}
    w = loss_token_weights(new, old, advantages, mask, **clip, dual_clip=3.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, -2.2, 0.0, -4.0]], dtype=torch.float64))
    assert w[1, 0] == 0 and w[0, 1] == 0 and w[1, 2] == 0  # exactly 0 where the indicator is 0
    w = loss_token_weights(new, old, advantages, mask, **clip)  # no dual clip: r = 4 stays inside
    assert trust_region_masks(ratio, advantages, mask, **clip)["neg_above"].nonzero().tolist() == [[1, 2], [1, 3]]
    torch.testing.assert_close(w[1], torch.tensor([0.0, -2.2, -8.0, -4.0], dtype=torch.float64))
    w = loss_token_weights(new, old, advantages, mask, ref_logprobs=new + math.log(2.0), beta=0.5, **clip,
                           dual_clip=3.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 1.0, 0.0], [0.5, -1.7, 0.5, -3.5]], dtype=torch.float64))


def test_offpolicy_metrics_sum_counts_and_average_weights_over_batches():
    """Two batches' rows of one (mini-batch, quartile) at beta 0 and 1e-3: counts add (3 + 1 clipped low), mean |w|
    inside is the mean of the batches' means (0.8 and 0.6: 0.7, SE = |0.8 - 0.6| / 2 = 0.1), the largest |w| where
    clipped is the max over batches per beta, and a quartile with nothing clipped has no such metric (not nan)."""
    import math

    from lab.referee_lopti_offpolicy import offpolicy_metrics
    base = {"mini_batch": 2, "quartile": 1, "tokens": 10, "clipped_high": 0, "dual_clipped": 0, "inside": 0,
            "neg_above_clip_high": 1, "max_abs_w_neg_above": 1.5, "ratio_min": 0.7, "ratio_max": 1.2}
    rows = [{**base, "seed": 0, "beta": 0.0, "clipped_low": 3, "mean_abs_w_inside": 0.8, "max_abs_w_clipped": 0.0},
            {**base, "seed": 1, "beta": 0.0, "clipped_low": 1, "mean_abs_w_inside": 0.6, "max_abs_w_clipped": 0.0},
            {**base, "seed": 0, "beta": 1e-3, "clipped_low": 3, "mean_abs_w_inside": 0.8, "max_abs_w_clipped": 2e-3},
            {**base, "seed": 1, "beta": 1e-3, "clipped_low": 1, "mean_abs_w_inside": 0.6, "max_abs_w_clipped": 5e-3},
            {**base, "seed": 0, "beta": 0.0, "quartile": 2, "clipped_low": 0, "mean_abs_w_inside": 0.5,
             "max_abs_w_clipped": math.nan}]
    m = offpolicy_metrics(rows, prefix="run_clip_")
    assert m["run_clip_mb2_Q1_tokens"] == 20 and m["run_clip_mb2_Q1_clipped_low"] == 4
    assert m["run_clip_mb2_Q1_neg_above_clip_high"] == 2 and m["run_clip_mb2_Q1_dual_clipped"] == 0
    assert m["run_clip_mb2_Q1_mean_abs_w_inside"] == 0.7 and m["run_clip_mb2_Q1_mean_abs_w_inside_se"] == 0.1
    assert m["run_clip_mb2_Q1_max_abs_w_clipped_beta0"] == 0 and m["run_clip_mb2_Q1_max_abs_w_neg_above"] == 1.5
    assert m["run_clip_mb2_Q1_max_abs_w_clipped_beta0.001"] == 5e-3
    assert m["run_clip_mb2_Q1_ratio_min"] == 0.7 and m["run_clip_mb2_Q1_ratio_max"] == 1.2
    assert "run_clip_mb2_Q2_max_abs_w_clipped_beta0" not in m and "run_clip_mb2_Q2_mean_abs_w_inside_se" not in m
    assert offpolicy_metrics(rows, keys=("clipped_high",), weights=False) == {"mb2_Q1_clipped_high": 0,
                                                                             "mb2_Q2_clipped_high": 0}


def test_onpolicy_metrics_by_hand():
    """Two batches: mean |w| of Q1 0.9 and 0.7 (0.8, SE 0.1); ||G_Q4|| / ||G_Q1|| = 0.1 / 1 and 0.3 / 1 (0.2, SE
    0.1); beta 1e-3 rows are not read."""
    from lab.referee_lopti import onpolicy_metrics
    rows = [{"seed": s, "beta": b, "quartile": q, "mean_abs_w": w, "summed_grad_norm": g, "p_min": q / 10 + s / 100,
             "p_max": q / 10 + 0.05 + s / 100, "share_of_full_norm": g / 1.5, "cos_with_full": 1.0 if q == 1 else 0.0,
             "token_logit_grad_norm": 0.1 * q, "token_param_grad_norm": 2.0 * q}
            for b in (0.0, 1e-3) for s, w1, g4 in ((0, 0.9, 0.1), (1, 0.7, 0.3))
            for q, w, g in ((1, w1 + b, 1.0), (2, 0.5, 0.2), (3, 0.5, 0.2), (4, 0.5, g4))]
    m = onpolicy_metrics(rows)
    assert m["onpolicy_Q1_mean_abs_w"] == 0.8 and m["onpolicy_Q1_mean_abs_w_se"] == 0.1
    assert m["onpolicy_Q4_mean_abs_w"] == 0.5 and m["onpolicy_Q4_mean_abs_w_se"] == 0
    assert m["onpolicy_G_Q4_over_G_Q1"] == 0.2 and m["onpolicy_G_Q4_over_G_Q1_se"] == 0.1
    assert m["onpolicy_Q2_p_old_min"] == 0.2 and m["onpolicy_Q2_p_old_max"] == 0.26  # over both batches
    assert m["onpolicy_Q4_share_of_norm"] == round(0.2 / 1.5, 6) and m["onpolicy_Q1_cos_with_full"] == 1.0
    assert m["onpolicy_Q3_token_param_grad_norm"] == 6.0 and m["onpolicy_Q3_token_param_grad_norm_se"] == 0
    from lab.referee_lopti import cosine_metrics
    cosines = cosine_metrics([{"seed": s, "beta": b, "quartile": 1, "with": 2, "cos": c + b}
                              for b in (0.0, 1e-3) for s, c in ((0, 0.1), (1, 0.3))])
    assert cosines == {"onpolicy_cos_Q1_Q2": 0.2, "onpolicy_cos_Q1_Q2_se": 0.1}


def test_lopti_verdict_reads_the_interval():
    from lab.referee_lopti import verdict
    assert verdict([0.10, 0.12, 0.11]).endswith("the dominance claim holds")
    assert verdict([0.9, 1.1, 1.0]).endswith("the dominance claim fails")
    assert verdict([0.1, 0.9, 0.5]).startswith("undecided")


def test_referee_lopti_end_to_end_before_and_after(tmp_path, digits_task, capsys):
    import train
    from lab import referee_lopti
    run = str(tmp_path / "run")
    train.main(["--task", "digits", *SMALL_TRAIN, "--steps", "2", "--output-dir", run])
    common = ["--checkpoint", os.path.join(run, "latest"), "--task", "digits", "--num-prompts", "3", "-M", "4",
              "--token-samples", "2", "--max-new-tokens", "6", "--beta", "0.1"]
    # off-policy state with a clip so narrow (ratio outside 1 -+ 1e-4) that one step must put tokens outside it
    rows, cosines, verdicts, off = referee_lopti.main([*common, "--seeds", "0,1", "--clip-low", "1e-4", "--clip-high",
                                                       "1e-4", "--output-dir", str(tmp_path / "after")])
    assert sorted({r["beta"] for r in rows}) == [0.0, 0.1]  # pi_ref: the run's initial policy
    assert len(rows) == 2 * 2 * 4 and len(cosines) == 2 * 2 * 12
    for r in rows:
        assert 0 <= r["share_of_full_norm"] <= 1 + 1e-6 and -1 - 1e-6 <= r["cos_with_full"] <= 1 + 1e-6
    assert "pi_ref" in capsys.readouterr().out
    assert len(off) == 2 * 2 * 2 * 4 == len(read_csv(tmp_path / "after" / "referee_lopti_offpolicy.csv"))
    for r in off:  # every token is inside or cut exactly once; the same tokens as the on-policy quartiles
        assert r["clipped_low"] + r["clipped_high"] + r["dual_clipped"] + r["inside"] == r["tokens"]
        assert r["dual_clipped"] == 0 and r["adamw_moments"] == "saved"
    for seed in (0, 1):
        for q in range(1, 5):
            assert sum(r["tokens"] for r in off if (r["seed"], r["beta"], r["quartile"]) == (seed, 0.0, q)) == \
                next(r["tokens"] for r in rows if (r["seed"], r["beta"], r["quartile"]) == (seed, 0.0, q))
    cut = [r for r in off if r["clipped_low"] + r["clipped_high"]]
    assert cut and all(r["max_abs_w_clipped"] == 0 for r in cut if r["beta"] == 0)  # the gradient is cut: w = 0
    assert all(0 < r["max_abs_w_clipped"] < 0.1 * 10 for r in cut if r["beta"] == 0.1)  # the KL part alone remains
    rows, _, verdicts, off = referee_lopti.main([*common, "--seeds", "0", "--initial", "--output-dir",
                                                 str(tmp_path / "before")])
    assert {r["beta"] for r in rows} == {0.0} and set(verdicts) == {0.0} and "no verdict" in verdicts[0.0]
    assert len(read_csv(tmp_path / "before" / "referee_lopti.csv")) == 4
    assert {r["adamw_moments"] for r in off} == {"fresh"}  # the initial policy: a run's first step


# ------------------------------------------------------------------------------------------------------------
# item 2: Eq. (2) exactly vs the clipped recipe

def test_eq2_run_has_ratio_one_and_equals_the_clipped_run_row_for_row(tmp_path, capsys, monkeypatch, one_thread):
    """One epoch, one mini-batch, no KL: the ratio is exactly 1 at every step, so the clip bounds cannot matter and
    the eq2 run must equal the sweep's run of the same method (clip 0.2 / 0.28) in every training row; with two
    mini-batches the second step is off-policy and the ratio leaves 1. The digits stub task (graded rewards, so
    an untrained model's groups differ) stands in for Countdown, whose task options it ignores."""
    import tasks
    from lab import referee_clipping
    from tests.stubs import DigitsTask
    monkeypatch.setitem(tasks.TASKS, "digits", lambda data=None, num_count=3: DigitsTask())
    out = str(tmp_path)
    small = [*SMALL_TRAIN, "--eval-size", "2", "--steps", "2", "--pass-k", "1", "--prompts-per-step", "4",
             "--task", "digits"]
    referee_tuning.main(["--seeds", "0", "--output-dir", out, "--configs", "grpo-M8", *small])
    runs, rows = referee_clipping.main(["--seeds", "0", "--output-dir", out, "--configs", "grpo-eq2,grpo-recipe-2mb",
                                        *small])
    printed = capsys.readouterr().out
    assert "grpo-eq2 seed 0 vs countdown3-tuning grpo-M8 (clip 0.2/0.28): identical in every training row" in printed
    eq2 = {r["config"]: r for r in runs}
    series = {c: referee_clipping.activity(os.path.join(eq2[c]["output_dir"], "metrics.jsonl")) for c in eq2}
    assert referee_clipping.ratio_is_one(series["grpo-eq2"])
    assert not referee_clipping.ratio_is_one(series["grpo-recipe-2mb"])
    assert series["grpo-recipe-2mb"]["kl"] and not series["grpo-eq2"]["kl"]
    assert "grpo-recipe-2mb - grpo-eq2 (1 seeds)" in printed


# ------------------------------------------------------------------------------------------------------------
def test_clipping_from_shipped_rows_by_hand(tmp_path, monkeypatch, capsys):
    from lab import referee_clipping, reproduce
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    monkeypatch.setattr(referee_clipping, "FIGURE", str(tmp_path / "activity.png"))
    made = {"commit": "c", "date": "d", "load": "1", "machine": "CPU A, avx512, 2 cores"}
    for seed, (eq2, recipe) in enumerate([(0.10, 0.15), (0.20, 0.21), (0.30, 0.38)]):
        reproduce.ship(f"countdown3-eq2-grpo-eq2-seed{seed}", {"after_pass@1": eq2, "ratio_exactly_one": 1.0,
                                                               "clip_frac_low_mean": 0.0}, made)
        reproduce.ship(f"countdown3-eq2-grpo-recipe-2mb-seed{seed}", {"after_pass@1": recipe, "ratio_exactly_one": 0.0,
                                                                      "clip_frac_low_mean": 0.001 * (seed + 1)}, made)
    runs = referee_clipping.main(["--shipped", "CPU A"])
    assert sorted(runs["grpo-eq2"]) == [0, 1, 2] and not runs["softmax-eq2"]
    out = capsys.readouterr().out
    assert "| grpo-eq2 | 3 | 0 [0] |" in out and "| 3 of 3 runs |" in out
    assert "| grpo-recipe-2mb | 3 | 0.002 [0.003] |" in out and "| 0 of 3 runs |" in out
    assert "grpo-recipe-2mb - grpo-eq2 (3 seeds): " in out and "+0.047" in out  # mean of +0.05, +0.01, +0.08


# item 3: Table 3 at several points of training

def test_table3_at_steps_over_seeds(tmp_path, capsys, monkeypatch, one_thread):
    """Both recipe runs keep every checkpoint; Table 3 on each of two steps gives shares summing to 1 per run,
    estimator and step, and counts what is not trained yet."""
    import tasks
    from lab import referee_table3
    from tests.stubs import DigitsTask
    monkeypatch.setitem(tasks.TASKS, "digits", lambda data=None, num_count=3: DigitsTask())
    out = str(tmp_path)
    small = [*SMALL_TRAIN, "--eval-size", "2", "--steps", "2", "--prompts-per-step", "4", "--task", "digits",
             "--save-every", "1"]
    referee_tuning.main(["--seeds", "0", "--output-dir", out, "--configs", "grpo-M8,softmax-M8-tau0.1",
                         "--pass-k", "off", *small])
    rows = referee_table3.main(["--seeds", "0,1", "--steps", "1,2", "--output-dir", out, "-M", "4", *SMALL_TRAIN,
                                "--task", "digits"])  # the runs' flags, for their task and temperature
    out_text = capsys.readouterr().out
    assert "2 of 4 runs have checkpoint-1" in out_text  # seed 1 not trained
    assert "measured part: the checkpoints of step 2" in out_text  # one seed: means, no interval
    assert {(r["step"], r["config"]) for r in rows} == {(s, c) for s in (1, 2) for c in referee_table3.CONFIGS}
    for step in (1, 2):
        for config in referee_table3.CONFIGS:
            mine = [r for r in rows if r["step"] == step and r["config"] == config]
            for key in ("share_grpo_advantages", "share_softmax_advantages"):
                assert sum(r[key] for r in mine) == pytest.approx(1, abs=1e-3)
    assert len(read_csv(os.path.join(out, "countdown3-tuning_table3_steps.csv"))) == len(rows)


def test_table3_at_steps_from_shipped_rows_pairs_the_trained_policies_by_seed(tmp_path, monkeypatch, capsys):
    from lab import referee_table3, reproduce
    from experiments.table3_allocation import BIN_NAMES
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path))
    monkeypatch.setattr(referee_table3, "FIGURE", str(tmp_path / "steps.png"))
    made = {"commit": "c", "date": "d", "load": "1", "machine": "CPU A, avx512, 2 cores"}
    for seed, (hard_grpo, hard_softmax) in enumerate([(200, 180), (210, 170), (220, 175)]):
        for config, hard in (("grpo-M8", hard_grpo), ("softmax-M8-tau0.1", hard_softmax)):
            values = {}
            for name, prompts in zip(BIN_NAMES, (hard, 256 - hard, 0, 0)):
                values.update({f"table3_step50_prompts_{name}": prompts, f"table3_step50_share_grpo_adv_{name}": 0.25,
                               f"table3_step50_share_softmax_adv_{name}": 0.25})
            reproduce.ship(f"countdown3-tuning-{config}-seed{seed}", values, made)
    rows = referee_table3.main(["--shipped", "CPU A", "--steps", "50"])
    assert len(rows) == 3 * 2 * len(BIN_NAMES)
    by_seed = referee_table3.by_seed_of(rows, 50)
    assert [by_seed["softmax"][s][f"table3_prompts_{BIN_NAMES[0]}"] - by_seed["grpo"][s][f"table3_prompts_{BIN_NAMES[0]}"]
            for s in range(3)] == [-20, -40, -45]
    out = capsys.readouterr().out
    assert "n = 3 seeds" in out and "-35.0 [" in out  # the hardest bin's paired difference: mean of -20, -40, -45
