"""Smoke tests and one substantive check per script: the ImageNet toy check, Fig. 1, plot_metrics, seed_stats.py's
pass@k estimator and t-interval, and compare.py's countdown3 preset.

Sizes are tiny (a few seconds in all); the default toy check itself takes ~2 minutes and is not run here.
"""

import csv
import importlib
import json
import math
import os
import sys

import numpy as np
import pytest
import torch

from experiments import fig1_prompt_weight, imagenet_toy, plot_metrics

from lab import compare, seed_stats
from softmax_grpo import grpo_prompt_weight, maxrl_weight, prompt_weight
from tests.stubs import SMALL_TRAIN

try:  # matplotlib is optional: the scripts write their PNGs only when it is installed
    import matplotlib  # noqa: F401
    HAS_MATPLOTLIB = True
except ImportError:
    HAS_MATPLOTLIB = False

# the toy check's smallest configuration: 100 classes (initial success 1%), 150 steps, default optimizer
SMALL_TOY = ["--classes", "100", "--dim", "16", "--noise", "1.0", "--train-per-class", "20", "--test-per-class", "10",
             "--hidden", "64", "--steps", "150", "--batch-size", "32", "--eval-every", "50", "--seed", "0"]


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------------------
# ImageNet-classification toy check

def test_toy_outputs_files_and_columns(tmp_path, capsys):
    finals = imagenet_toy.main(SMALL_TOY + ["--group-sizes", "2,4", "--steps", "40", "--eval-every", "15",
                                            "--output-dir", str(tmp_path)])
    curves = read_csv(tmp_path / "curves.csv")
    assert list(curves[0]) == ["step", "method", "M", "tau", "lr", "top1", "pass@1", "pass@128", "entropy",
                               "train_reward"]
    # one run of cross-entropy (it does not sample) + 4 RL methods x 2 group sizes, 4 evaluations each (0,15,30,40)
    assert len(finals) == 1 + 4 * 2
    assert len(curves) == 4 * len(finals)
    assert {(r["method"], r["M"]) for r in curves} == {("ce", "")} | {
        (m, g) for m in ("reinforce", "grpo", "maxrl", "softmax") for g in ("2", "4")}
    assert all(0.0 <= float(r["top1"]) <= 1.0 and 0.0 <= float(r["pass@1"]) <= float(r["pass@128"]) <= 1.0
               for r in curves)
    # every run starts from the same uniform policy: pass@1 = 1/C, pass@128 = 1 - (1 - 1/C)^128, entropy log C
    for row in curves:
        if row["step"] == "0":
            assert float(row["pass@1"]) == pytest.approx(1 / 100, rel=1e-5)
            assert float(row["pass@128"]) == pytest.approx(1 - 0.99 ** 128, rel=1e-5)
            assert float(row["entropy"]) == pytest.approx(math.log(100), rel=1e-5)
    # the lr logged at step 15 is the one of update 14: 4 warm-up updates (10% of 40) are over, cosine at 10/36
    assert float(curves[1]["lr"]) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 10 / 36)))
    assert {r["tau"] for r in curves if r["method"] == "softmax"} == {"0.2"}
    final_rows = read_csv(tmp_path / "final.csv")
    assert len(final_rows) == len(finals) and "wall_s" in final_rows[0]
    out = capsys.readouterr().out
    assert "| method | M=2 | M=4 |" in out and "| softmax (tau=0.2) |" in out and "top-1 / pass@1 / pass@128" in out
    assert (tmp_path / "curves.png").exists() == HAS_MATPLOTLIB


def test_toy_cross_entropy_beats_reinforce(tmp_path):
    """The paper's premise at the smallest config, fixed seed: with initial success 1% and M = 4, exact maximum
    likelihood learns (far above chance) while REINFORCE, which sees the label only when it samples it, lags."""
    finals = imagenet_toy.main(SMALL_TOY + ["--methods", "ce,reinforce", "--group-sizes", "4",
                                            "--output-dir", str(tmp_path)])
    accuracy = {row["method"]: row["top1"] for row in finals}
    assert accuracy["ce"] > 0.4  # chance is 0.01
    assert accuracy["ce"] > accuracy["reinforce"] + 0.2


def test_toy_is_deterministic_under_seed(one_thread):
    data = imagenet_toy.make_synthetic(num_classes=20, dim=8, train_per_class=10, test_per_class=5, seed=3)
    cfg = imagenet_toy.ToyConfig(steps=30, batch_size=16, eval_every=10, hidden=16, lr=1e-2, seed=3)
    first = imagenet_toy.train_one(data, "softmax", 4, cfg)
    second = imagenet_toy.train_one(data, "softmax", 4, cfg)
    assert first == second
    assert imagenet_toy.train_one(data, "softmax", 4, imagenet_toy.ToyConfig(
        steps=30, batch_size=16, eval_every=10, hidden=16, lr=1e-2, seed=4)) != first


@pytest.mark.parametrize("method, tau", [("reinforce", 0.2), ("grpo", 0.2), ("maxrl", 0.2), ("softmax", 0.2),
                                         ("softmax", 1.0)])
def test_toy_rl_loss_is_the_policy_gradient_of_eq4(method, tau, one_thread):
    """E[grad of the toy's RL loss w.r.t. the logits] = -omega(p) * grad p, grad p = p (onehot(y*) - pi).

    One image's logits z are shared by B copies, so the loss gradient is a Monte Carlo average over B groups of
    M sampled labels. omega = 1 for the batch-mean REINFORCE baseline (up to 1/(B M)), grpo_prompt_weight for
    GRPO, maxrl_weight for MaxRL and prompt_weight for SoftmaxGRPO (DESIGN.md §3). B = 40 000, M = 4: standard error ~1e-3 per coordinate,
    tolerance 6e-3; a wrong weight (e.g. omega = 1 for softmax, where omega ~ 2.2) is off by > 0.1.
    """
    num_groups, M = 40_000, 4
    logits = torch.tensor([1.0, 0.2, -0.3, 0.0, -1.0], requires_grad=True)
    label = 0
    pi = torch.softmax(logits.detach(), -1)
    p = pi[label].item()
    labels = torch.full((num_groups,), label)
    loss, mean_reward = imagenet_toy.one_step_rl_loss(logits.expand(num_groups, -1), labels, method, M, tau,
                                                      torch.Generator().manual_seed(0))
    loss.backward()
    omega = {"reinforce": 1.0, "grpo": grpo_prompt_weight(p, M), "maxrl": maxrl_weight(p, M),
             "softmax": prompt_weight(p, M, tau)}[method]
    grad_p = p * (torch.nn.functional.one_hot(torch.tensor(label), 5).float() - pi)
    assert mean_reward == pytest.approx(p, abs=0.01)
    assert torch.allclose(logits.grad, -omega * grad_p, atol=6e-3), (logits.grad, -omega * grad_p)


def test_pass_at_k_exact_formula():
    """pass@k = 1 - (1 - p)^k: by hand, its limits, and the chance that k sampled labels include the true one."""
    p = torch.tensor([0.0, 0.5, 1.0, 1e-3], dtype=torch.float64)
    assert imagenet_toy.pass_at_k(p, 2).tolist() == pytest.approx([0.0, 0.75, 1.0, 1 - 0.999 ** 2], rel=1e-12)
    assert imagenet_toy.pass_at_k(p, 1).tolist() == pytest.approx(p.double().tolist(), rel=1e-7)
    # p = 1/1000 (the uniform policy over ImageNet's classes): 1 - 0.999^128 = 1 - exp(128 ln 0.999) = 0.1202030
    assert imagenet_toy.pass_at_k(torch.tensor([1e-3]), 128).item() == pytest.approx(0.1202030, abs=1e-6)
    # Monte Carlo: 20 000 draws of 128 labels from pi = softmax(z); the share containing y* has std error ~3.5e-3
    pi = torch.softmax(torch.tensor([0.5, 0.0, -0.5, 1.0] + [0.0] * 96), -1)
    draws = torch.multinomial(pi.expand(20_000, -1), 128, replacement=True, generator=torch.Generator().manual_seed(0))
    observed = (draws == 2).any(1).double().mean().item()
    assert observed == pytest.approx(imagenet_toy.pass_at_k(pi[2:3], 128).item(), abs=0.015)


def test_lr_schedule_warmup_then_cosine():
    """10 updates, 2 of warm-up: lr factors 0, 1/2, then 0.5 (1 + cos(pi (s - 2) / 8)) for s = 2..9."""
    factors = [imagenet_toy.lr_factor(s, 2, 10) for s in range(11)]
    by_hand = [0.0, 0.5, 1.0, 0.5 * (1 + math.cos(math.pi / 8)), 0.5 * (1 + math.sqrt(0.5)), None, 0.5, None,
               0.5 * (1 - math.sqrt(0.5)), None, 0.0]
    assert all(f == pytest.approx(h) for f, h in zip(factors, by_hand) if h is not None)
    assert all(a > b for a, b in zip(factors[2:], factors[3:]))  # strictly decreasing after the warm-up
    assert [imagenet_toy.lr_factor(s, 0, 4) for s in (0, 2, 4)] == pytest.approx([1.0, 0.5, 0.0])  # no warm-up


def test_toy_optimizers_are_the_papers_sgd_or_plain_adam():
    sgd_cfg, adam_cfg = imagenet_toy.ToyConfig(), imagenet_toy.ToyConfig(optimizer="adam")
    assert (sgd_cfg.optimizer, sgd_cfg.lr, adam_cfg.lr) == ("sgd", 0.1, 3e-4)  # one lr per optimizer
    params = [torch.nn.Parameter(torch.zeros(2))]
    group = imagenet_toy.make_optimizer(params, "sgd", 0.1).param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]) == (0.1, 0.9, 1e-4, False)
    assert isinstance(imagenet_toy.make_optimizer(params, "adam", 3e-4), torch.optim.Adam)
    _, cfg = imagenet_toy.parse_args(["--optimizer", "adam", "--schedule", "constant"])
    assert (cfg.lr, cfg.schedule) == (3e-4, "constant")


def test_toy_loads_real_features(tmp_path):
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(6).repeat(10)
    features = torch.nn.functional.one_hot(labels, 6).float() * 3 + torch.randn(60, 6, generator=gen)
    np.savez(tmp_path / "feats.npz", features=features.numpy(), labels=labels.numpy())
    torch.save({"features": features, "labels": labels}, tmp_path / "feats.pt")
    for name in ("feats.npz", "feats.pt"):
        data = imagenet_toy.load_features(str(tmp_path / name), test_fraction=0.25, seed=0)
        assert data.num_classes == 6 and len(data.test_y) == 15 and len(data.train_y) == 45
    finals = imagenet_toy.main(["--features", str(tmp_path / "feats.npz"), "--methods", "ce,softmax",
                                "--group-sizes", "2", "--steps", "20", "--batch-size", "8", "--eval-every", "10",
                                "--optimizer", "adam", "--lr", "1e-2", "--output-dir", str(tmp_path / "out")])
    assert len(finals) == 2


def test_toy_bad_input(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        imagenet_toy.load_features(str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "wrong.npz", x=np.zeros((4, 2)))
    with pytest.raises(ValueError, match="'features' and 'labels'"):
        imagenet_toy.load_features(str(tmp_path / "wrong.npz"))
    with pytest.raises(SystemExit):
        imagenet_toy.parse_args(["--methods", "ce,nonsense"])
    with pytest.raises(SystemExit):
        imagenet_toy.parse_args(["--group-sizes", "1"])
    with pytest.raises(SystemExit):
        imagenet_toy.parse_args(["--warmup-fraction", "1"])
    with pytest.raises(SystemExit, match="file not found"):
        imagenet_toy.main(["--features", str(tmp_path / "missing.pt"), "--output-dir", str(tmp_path)])


# ------------------------------------------------------------------------------------------------------------
# Fig. 1: prompt weights

def test_fig1_csv_matches_the_exact_functions(tmp_path):
    fig1_prompt_weight.main(["--points", "11", "--output-dir", str(tmp_path)])
    rows = read_csv(tmp_path / "fig1_prompt_weight.csv")
    assert list(rows[0]) == ["p", "reinforce", "grpo", "maxrl", "softmax_tau0.1", "softmax_tau0.3", "softmax_tau1"]
    assert [float(r["p"]) for r in rows] == pytest.approx(np.linspace(0, 1, 11))
    for row in rows[::3] + [rows[-1]]:  # sampled points, including both ends
        p = float(row["p"])
        assert float(row["reinforce"]) == 1.0
        assert float(row["grpo"]) == pytest.approx(grpo_prompt_weight(p, 8), rel=1e-8)
        assert float(row["maxrl"]) == pytest.approx(maxrl_weight(p, 8), rel=1e-8)
        for tau in (0.1, 0.3, 1.0):
            assert float(row[f"softmax_tau{tau:g}"]) == pytest.approx(prompt_weight(p, 8, tau), rel=1e-8)
    # the figure's message: SoftmaxGRPO favours hard prompts (omega decreasing in p), REINFORCE is flat
    softmax = [float(r["softmax_tau0.3"]) for r in rows]
    assert all(a > b for a, b in zip(softmax, softmax[1:]))
    assert (tmp_path / "fig1_prompt_weight.png").exists() == HAS_MATPLOTLIB


def test_fig1_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    fig1_prompt_weight.main(["--points", "5", "--group-size", "4", "--taus", "0.5", "--output-dir", str(tmp_path)])
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert (tmp_path / "fig1_prompt_weight.csv").exists()
    assert not (tmp_path / "fig1_prompt_weight.png").exists()


# ------------------------------------------------------------------------------------------------------------
# plot_metrics

def write_metrics(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def synthetic_metrics():
    rows = [{"step": 0, "eval": True, "pass@1": 0.1, "reward": 0.1, "length": 8.0, "pass@1_se": 0.03}]
    for step in range(1, 11):
        rows.append({"step": step, "reward_mean": 0.1 * step, "pass_rate": 0.05 * step, "clip_frac_low": 0.01,
                     "clip_frac_high": 0.02, "entropy": 2.0 - 0.1 * step, "response_length": 9.0, "grad_norm": 1.0})
    rows.append({"step": 10, "eval": True, "pass@1": 0.6, "reward": 0.6, "length": 9.0, "pass@1_se": 0.05})
    return rows


def test_plot_metrics_finds_series_and_writes_png(tmp_path, capsys):
    write_metrics(tmp_path / "metrics.jsonl", synthetic_metrics())
    panels = dict(plot_metrics.main([str(tmp_path / "metrics.jsonl"), "--extra", "grad_norm"]))
    keys = {title: {(entry[2], entry[3]) for entry in found} for title, found in panels.items()}
    assert keys["reward"] == {(False, "reward_mean"), (True, "reward")}
    assert keys["pass rate"] == {(False, "pass_rate"), (True, "pass@1")}
    assert keys["clip fraction"] == {(False, "clip_frac_low"), (False, "clip_frac_high")}
    assert keys["KL to reference (k3)"] == set()  # no reference model in this run: skipped, not an error
    assert keys["grad_norm"] == {(False, "grad_norm")}
    eval_pass = [entry for entry in panels["pass rate"] if entry[2]][0]
    assert eval_pass[4] == [0, 10] and eval_pass[5] == [0.1, 0.6]  # eval rows kept apart from training rows
    assert eval_pass[6] == [0.03, 0.05]  # train.py's standard errors: drawn as bars
    assert [entry for entry in panels["reward"] if entry[2]][0][6] is None  # no reward_se: plain markers
    assert "(no matching keys)" in capsys.readouterr().out
    assert (tmp_path / "metrics.png").exists() == HAS_MATPLOTLIB


def test_plot_metrics_draws_only_the_panels_asked_for(tmp_path, capsys):
    write_metrics(tmp_path / "metrics.jsonl", synthetic_metrics())
    panels = plot_metrics.main([str(tmp_path / "metrics.jsonl"), "--panels", "reward, Pass", "--output",
                                str(tmp_path / "two.png")])
    assert [title for title, _ in panels] == ["reward", "pass rate"]
    with pytest.raises(SystemExit):
        plot_metrics.main([str(tmp_path / "metrics.jsonl"), "--panels", "rewards,lr"])
    assert "no panel title starts with rewards, lr" in capsys.readouterr().err


def test_plot_metrics_tolerates_key_variants_and_rejects_bad_lines(tmp_path):
    write_metrics(tmp_path / "a.jsonl", [{"step": 1, "train/Reward": 0.5, "KL": 0.01, "pass_rate": None}])
    panels = dict(plot_metrics.collect([str(tmp_path / "a.jsonl")]))
    assert [entry[3] for entry in panels["reward"]] == ["train/Reward"]
    assert [entry[3] for entry in panels["KL to reference (k3)"]] == ["KL"]
    assert panels["pass rate"] == []  # null values are skipped
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        plot_metrics.read_metrics(str(tmp_path / "bad.jsonl"))
    (tmp_path / "huge.jsonl").write_bytes(b'{"step": 1}\n' + b"7" * (3 << 20) + b"\n{\"step\": 2}\n")
    with pytest.raises(ValueError, match=r"huge.jsonl:2: a line longer than 1048576 bytes"):
        plot_metrics.read_metrics(str(tmp_path / "huge.jsonl"))  # skipped in chunks, never read whole


def test_plot_metrics_reads_a_run_folder_that_is_still_writing(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_metrics(run / "metrics.jsonl", synthetic_metrics())
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "reward_me')  # the row train.py is writing at this instant
    panels = dict(plot_metrics.main([str(run)]))
    reward = [entry for entry in panels["reward"] if not entry[2]][0]
    assert reward[0] == "run" and reward[4][-1] == 10  # the finished rows, labelled by the folder
    assert (run / "metrics.png").exists() == HAS_MATPLOTLIB


# ------------------------------------------------------------------------------------------------------------
# seed_stats.py: the pass@k estimator and the t-interval; compare.py: the countdown3 preset end to end

def test_a_paired_t_tests_p_by_hand_and_holms_step_down():
    """p = 2 (1 - F_t(|mean| / SE; n - 1)); Holm keeps the k-th smallest p while it is below 0.05 / (m - k)."""
    assert seed_stats.t_cdf(2.776, 4) == pytest.approx(0.975, abs=1e-4)  # the t table's 97.5% point, 4 df
    assert seed_stats.t_cdf(0.0, 7) == 0.5 and seed_stats.t_cdf(-1.5, 3) == pytest.approx(1 - seed_stats.t_cdf(1.5, 3))
    # differences 1, 2, 3: mean 2, SD 1, SE 1/sqrt(3), t = 2 sqrt(3) = 3.464 on 2 df: p = 1 - t/sqrt(t^2 + 2) = 0.0742
    t = 2 * math.sqrt(3)
    assert seed_stats.paired_p([1.0, 2.0, 3.0]) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-6)
    assert seed_stats.paired_p([-1.0, -2.0, -3.0]) == seed_stats.paired_p([1.0, 2.0, 3.0])  # two-sided
    with pytest.raises(ValueError):
        seed_stats.paired_p([0.1, 0.1])  # no spread: no test
    # five tests: Bonferroni's 0.01 drops 0.012; Holm's thresholds 0.01, 0.0125, 0.0167, 0.025, 0.05 keep it
    assert seed_stats.holm([0.012, 0.009, 1e-4, 1e-4, 0.069]) == [True, True, True, True, False]
    # the step-down stops at the first failure: 0.03 >= 0.05 / 2 fails, so 0.04 (< 0.05) is not reached
    assert seed_stats.holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert seed_stats.holm([0.2]) == [False] and seed_stats.holm([0.049]) == [True]  # one test: no correction


def test_unbiased_pass_at_k_by_hand_and_its_limit():
    """Chen et al. 2021: 1 - C(n-c, k) / C(n, k)."""
    assert seed_stats.pass_at_k(8, 1, 2) == pytest.approx(1 - 21 / 28)  # C(7,2) = 21, C(8,2) = 28: 0.25
    assert seed_stats.pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # only the one pair of the two failures fails
    assert seed_stats.pass_at_k(8, 3, 1) == pytest.approx(3 / 8)  # pass@1 = c / n
    assert seed_stats.pass_at_k(8, 0, 8) == 0.0 and seed_stats.pass_at_k(8, 1, 8) == 1.0  # k = n: any pass at all
    assert seed_stats.pass_at_k(8, 6, 4) == 1.0  # fewer failures than k
    # many samples: drawing without replacement from n = 10^6 with c = p n is the binomial 1 - (1 - p)^k
    assert seed_stats.pass_at_k(10 ** 6, 10 ** 5, 4) == pytest.approx(1 - 0.9 ** 4, rel=1e-5)
    # monotone in k
    values = [seed_stats.pass_at_k(8, 2, k) for k in range(1, 9)]
    assert all(a < b for a, b in zip(values, values[1:6])) and values[-1] == 1.0
    assert seed_stats.pass_ks(8) == [1, 2, 4, 8] and seed_stats.pass_ks(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError):
        seed_stats.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        seed_stats.pass_at_k(4, 1, 5)


def test_t_quantile_and_interval():
    """Student's t 0.975 quantiles from the usual tables, and the closed forms for df 1 and 2."""
    for df, table in [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423), (120, 1.9799)]:
        assert seed_stats.t_quantile(0.975, df) == pytest.approx(table, abs=2e-4)
    assert seed_stats.t_quantile(0.75, 1) == pytest.approx(1.0, abs=1e-6)  # Cauchy: tan(pi / 4)
    assert seed_stats.t_quantile(0.9, 2) == pytest.approx(0.8 / math.sqrt(2 * 0.9 * 0.1), abs=1e-6)  # closed form df 2
    mean, se, (low, high) = seed_stats.mean_se_interval([0.1, 0.2, 0.3, 0.4, 0.5])
    assert (mean, se) == pytest.approx((0.3, math.sqrt(0.025 / 5)))
    assert (low, high) == pytest.approx((0.3 - 2.7764 * se, 0.3 + 2.7764 * se), abs=1e-4)
    assert seed_stats.mean_se_interval([0.2]) == (0.2, None, None)
    with pytest.raises(ValueError):
        seed_stats.t_quantile(0.4, 3)


def test_seeds_for_a_half_width_by_hand():
    """The power calculation: the fewest n with t_{.975, n-1} sd / sqrt(n) <= target. sd 0.05, target 0.03: at n = 13
    the half-width is 2.1788 * 0.05 / sqrt(13) = 0.0302 (too wide), at n = 14 2.1604 * 0.05 / sqrt(14) = 0.0289."""
    assert seed_stats.seeds_for_half_width(0.05, 0.03) == 14
    assert seed_stats.seeds_for_half_width(0.0, 0.03) == 2  # no spread: the fewest seeds an interval needs
    # the large-n limit: n ~ (1.96 sd / target)^2 once t is close to the normal quantile
    assert seed_stats.seeds_for_half_width(0.3, 0.03) == pytest.approx((1.96 * 0.3 / 0.03) ** 2, rel=0.03)
    assert seed_stats.seeds_for_half_width(1.0, 0.001, most=50) is None
    with pytest.raises(ValueError):
        seed_stats.seeds_for_half_width(0.05, 0.0)


def test_compare_countdown3_end_to_end_with_pass_at_k(tmp_path, capsys, one_thread):
    out = str(tmp_path / "cmp")
    compare.main(["--preset", "countdown3", "--seeds", "0,1", "--output-dir", out, *SMALL_TRAIN, "--steps", "2"])
    runs = read_csv(os.path.join(out, "countdown3_runs.csv"))
    assert {(r["config"], r["seed"]) for r in runs} == {(c, s) for c in ("grpo", "softmax") for s in ("0", "1")}
    ks = [f"sampled_pass@{k}" for k in (1, 2, 4)]  # M = 4 (SMALL_TRAIN's --num-generations)
    assert set(ks) <= set(runs[0]) and "sampled_pass@8" not in runs[0]
    for r in runs:
        values = [float(r[key]) for key in ks]
        assert all(0.0 <= v <= 1.0 for v in values) and values == sorted(values)  # pass@k grows with k
        assert r["samples_per_prompt"] == "4" and "num_count=3" in r["argv"] and "--steps 2" in r["argv"]
        assert os.path.isdir(os.path.join(r["output_dir"], "latest"))
    summary = read_csv(os.path.join(out, "countdown3_summary.csv"))
    assert [r["config"] for r in summary] == ["grpo", "softmax"]
    for key in ["after_pass@1", *ks]:
        assert {f"{key}_mean", f"{key}_se", f"{key}_vs_first_mean", f"{key}_vs_first_ci95_low",
                f"{key}_vs_first_ci95_high"} <= set(summary[0])
    softmax = summary[1]
    for key in ks:  # the interval holds the paired mean; the mean is the per-seed mean
        assert float(softmax[f"{key}_vs_first_ci95_low"]) <= float(softmax[f"{key}_vs_first_mean"]) \
            <= float(softmax[f"{key}_vs_first_ci95_high"])
        assert float(softmax[f"{key}_mean"]) == pytest.approx(
            sum(float(r[key]) for r in runs if r["config"] == "softmax") / 2, abs=1e-4)
    assert float(summary[0]["sampled_pass@1_vs_first_mean"]) == 0.0
    printed = capsys.readouterr().out
    assert "| softmax - grpo (paired, 95% t-interval) | 2 |" in printed and "pass@4" in printed
    # an untrained tiny policy solves no 3-number problem: Table 3 has nothing to share out, and says so, once
    # per run, without stopping the comparison (its tables and CSVs above are written)
    assert printed.count("Table 3 skipped for this run") == 4 and "Table 3 skipped: no final policy" in printed
    assert os.path.exists(os.path.join(out, "countdown3.png")) == HAS_MATPLOTLIB


def test_compare_without_matplotlib_or_pass_at_k(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = str(tmp_path / "cmp")
    compare.main(["--preset", "countdown3", "--seeds", "0", "--configs", "softmax", "--pass-k", "off",
                  "--output-dir", out, *SMALL_TRAIN, "--steps", "1"])
    assert "matplotlib is not installed" in capsys.readouterr().out
    runs = read_csv(os.path.join(out, "countdown3_runs.csv"))
    assert not any(key.startswith("sampled_") for key in runs[0])
    assert not os.path.exists(os.path.join(out, "countdown3.png"))


# ------------------------------------------------------------------------------------------------------------
# smollm2_cpu.py (the real-model run itself is a measurement: docs/results.md)

def test_smollm2_cpu_data_holds_out_prompts_never_trained_on():
    import random

    from experiments import smollm2_cpu
    from tasks.text_match import similarity
    train, test = smollm2_cpu.instruction_rows(600, 128, random.Random(0))
    assert len(train) == 600 and len(test) == 128 and len({r["prompt"] for r in test}) == 128
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}  # the loader would drop such train rows
    kinds = [r["prompt"].split()[0] for r in train]
    assert 0.5 < kinds.count("Repeat") / len(train) < 0.7 and 0.1 < kinds.count("Write") / len(train) < 0.3
    held_out_words = {r["prompt"] for r in test if not r["prompt"].startswith("Repeat")}
    assert len(held_out_words) == 15 + 10  # every fourth counting range and opposite pair
    repeat = next(r for r in test if r["prompt"].startswith("Repeat"))
    assert repeat["prompt"] == f"Repeat this sentence: {repeat['reference']}."
    count = next(r for r in test if r["prompt"].startswith("Count"))
    words = count["reference"].split()  # "Count from three to six in words." -> "three four five six"
    assert count["prompt"] == f"Count from {words[0]} to {words[-1]} in words." and len(words) >= 3
    assert all(similarity(r["reference"], r["reference"]) == 1.0 for r in train + test)
    assert smollm2_cpu.instruction_rows(50, 40, random.Random(1)) == smollm2_cpu.instruction_rows(50, 40,
                                                                                                   random.Random(1))


def test_smollm2_cpu_runs_its_seeds_on_the_tiny_model(tmp_path, capsys):
    from experiments import smollm2_cpu
    out = str(tmp_path / "smol")
    table = smollm2_cpu.main(["--seeds", "0,1", "--output-dir", out, "--model", "tiny", *SMALL_TRAIN, "--steps", "2",
                              "--eval-size", "8"])
    assert {(row["seed"], row["step"]) for row in table} == {(s, t) for s in (0, 1) for t in (0, 2)}
    assert all(row["reward_se"] >= 0 and 0 <= row["pass@1"] <= 1 for row in table)
    printed = capsys.readouterr().out
    assert "| seed | reward gain | / SE |" in printed
    with open(os.path.join(out, "data", "test.jsonl")) as f:
        assert len(f.readlines()) == smollm2_cpu.EVAL_SIZE
    assert os.path.exists(os.path.join(out, "smollm2_cpu.png")) == HAS_MATPLOTLIB


@pytest.mark.parametrize("script", ["experiments.smollm2_cpu", "lab.compare"])
@pytest.mark.parametrize("flag", ["--seed", "--seed=2", "--overwrite", "--resume"])
def test_a_flag_the_script_sets_for_each_run_is_refused(script, flag, tmp_path, capsys):
    # `--seed 2` (meant: --seeds 2) used to reach every train.py run, where the last --seed won: seed 2 trained into
    # seed0/ and seed1/ and labelled seed 0 and 1. Now one line, before anything runs.
    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--output-dir", str(tmp_path / "out"), flag, *(["2"] if "=" not in flag and "seed" in flag
                                                                     else [])])
    assert exit_info.value.code == 2
    assert f"{flag.split('=')[0]} is set by this script for each of its runs" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out" / "seed0")


def test_an_experiment_dry_run_prints_each_runs_settings(tmp_path, capsys):
    from experiments import smollm2_cpu
    out = tmp_path / "smol"
    assert smollm2_cpu.main(["--seeds", "0,1", "--output-dir", str(out), "--model", "tiny", "--dry-run"]) is None
    printed = capsys.readouterr().out
    decoder, settings, at = json.JSONDecoder(), [], printed.find("{\n")
    while at >= 0:
        value, end = decoder.raw_decode(printed, at)
        settings.append(value)
        at = printed.find("{\n", end)
    assert [s["seed"] for s in settings] == [0, 1]
    assert [s["output_dir"] for s in settings] == [str(out / "seed0"), str(out / "seed1")]
    assert not os.path.exists(out / "seed0" / "metrics.jsonl")


# --- Table 3: what is identity and what is measurement ----------------------------------------------------------------
@pytest.mark.parametrize("M, tau", [(16, 0.1), (8, 0.3), (4, 1.0)])
def test_binary_softmax_advantages_are_grpos_times_a_factor_of_k(M, tau):
    # Both estimators give a group's successes one advantage and its failures another, summing to 0: proportional.
    # By hand: A_soft(success) = (M-k)(e-1)/(k e + M - k) with e = exp(1/tau); A_grpo(success) = (1-p)/s with the
    # sample std s = sqrt(M/(M-1) p (1-p)), p = k/M; their ratio is the closed form below.
    from experiments.table3_allocation import identity_table
    e = math.exp(1 / tau)
    for row in identity_table(M, tau):
        k = row["k"]
        closed = (e - 1) * math.sqrt(k * (M - k)) / ((k * e + M - k) * math.sqrt((M - 1) / M))
        assert row["ratio"] == pytest.approx(closed, rel=1e-5)  # float32 and GRPO's eps in the std
    ratios = [row["ratio"] for row in identity_table(M, tau)]
    assert all(a > b for a, b in zip(ratios, ratios[1:]))  # falls strictly with k, for any policy


def test_the_same_samples_share_comparison_follows_from_the_k_histogram_alone():
    # Any binary rewards and lengths: SoftmaxGRPO's bin shares equal GRPO's budgets reweighted by c(k), so the
    # comparison on the same samples carries no information beyond which k each prompt had.
    from experiments.table3_allocation import allocation_table, binary_advantage_ratio, bin_index, token_budget
    from softmax_grpo import group_advantages
    generator = torch.Generator().manual_seed(0)
    M, tau = 16, 0.1
    rewards = (torch.rand(64, M, generator=generator) < torch.rand(64, 1, generator=generator) ** 2).float()
    lengths = torch.randint(1, 40, (64, M), generator=generator).float()
    rows = allocation_table(rewards, 1.0, lengths, tau=tau)
    k = rewards.sum(1).long()
    factor = torch.tensor([binary_advantage_ratio(int(j), M, tau) if 0 < j < M else 0.0 for j in k])
    budget = token_budget(group_advantages(rewards, "grpo"), lengths) * factor
    bins = bin_index(k.float() / M)
    predicted = torch.stack([budget[bins == b].sum() for b in range(4)]) / budget.sum()
    measured = torch.tensor([r["share"] for r in rows if r["method"] == "softmax"])
    assert torch.allclose(measured, predicted.float(), atol=1e-5)
