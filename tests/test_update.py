"""train.update_policy, Algorithm 1's update as written, against its fast path (fast/update.py): the same weights
after the same batch, for every loss aggregation the plain update supports; and what each reads of the settings."""
import ast
import copy
import inspect
import os

import pytest
import torch

import train
from harness.config import Config
from harness.tiny import build_tiny_model
from ppo import LOSS_AGGS
from tests.stubs import tiny_policy_and_rollouts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAIN_LOSS_AGGS = [agg for agg in LOSS_AGGS if agg != "token-mean-per-micro-batch"]  # that one: fast/ only


def OPTIMIZER(parameters):  # noqa: N802
    # SGD: a weight moves by its gradient, so the weights agree as the gradients do (to ~1e-7 here, moving ~0.1);
    # AdamW divides by sqrt(v), which turns rounding in a near-zero gradient into a visible step (~1e-5 at lr 1e-2)
    return torch.optim.SGD(parameters, lr=0.5)


def both_updates(settings, advantages, *, kl, paths=(False, True), micro_batch=3):
    """(plain, fast) -> (stats, weights) of one update of the same tiny policy on the same 8 rollouts (paths: the
    config.fast of each)."""
    tokenizer, _, r = tiny_policy_and_rollouts()
    r.completion_mask[1, 2:] = 0  # unequal lengths, so that the aggregations differ
    r.attention_mask[1, -4:] = 0
    results = []
    for fast in paths:
        policy = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
        ref_model = copy.deepcopy(policy).eval() if kl else None
        with torch.no_grad():  # the reference apart from the policy, so that the k3 term has a gradient
            for parameter in (ref_model.parameters() if kl else []):
                parameter.add_(0.01 * torch.randn_like(parameter))
        optimizer = OPTIMIZER(policy.parameters())
        config = Config(**settings, kl_coef=0.1 if kl else 0.0, micro_batch=micro_batch, max_new_tokens=6, dtype="fp32",
                        fast=fast)
        stats = train.update_batch(policy, optimizer, r.input_ids, r.attention_mask, r.completion_mask,
                                   advantages, config, ref_model=ref_model)
        results.append((stats, {k: v.detach().clone() for k, v in policy.state_dict().items()}))
    return results


@pytest.mark.parametrize("loss_agg", PLAIN_LOSS_AGGS)
@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl"])
def test_the_plain_and_the_fast_update_end_at_the_same_weights(loss_agg, kl):
    # AR, Lopti, two epochs of two mini-batches; rows with advantage 0 (the fast path never forwards them); micro-
    # batches of 3 rows on the fast path, one forward per mini-batch on the plain one
    settings = dict(alpha=0.3, lopti_eta=0.5, ppo_epochs=2, mini_batches=2, loss_agg=loss_agg, dual_clip=3.0)
    advantages = torch.tensor([1.0, -0.5, 0.0, 0.7, 0.0, 0.0, -1.2, 0.4])
    (plain_stats, plain), (fast_stats, fast) = both_updates(settings, advantages, kl=kl)
    assert plain_stats["optimizer_steps"] == fast_stats["optimizer_steps"] > 2
    assert plain_stats["grad_norm"] == pytest.approx(fast_stats["grad_norm"], rel=1e-4)
    for key in plain:
        torch.testing.assert_close(plain[key], fast[key], atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.parametrize("settings", [dict(alpha=0.3, lopti_eta=0.5, ppo_epochs=2, mini_batches=2, dual_clip=3.0),
                                      dict()], ids=["ar-lopti-2x2", "one-step"])
@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl"])
def test_both_paths_return_the_same_metrics(settings, kl):
    # one update's metrics whatever the path: the same keys, the same values. ratio_max is the max over every
    # step (not a mean of maxima), entropy pi_old's over the tokens that can learn (one-step: the fast path reads it
    # in its only step's forwards, which run at pi_old's weights), the loss's stats merged over the micro-batches
    advantages = torch.tensor([1.0, -0.5, 0.0, 0.7, 0.0, 0.0, -1.2, 0.4])
    (plain_stats, _), (fast_stats, _) = both_updates(settings, advantages, kl=kl)
    assert set(plain_stats) == set(fast_stats)
    expected = {"loss", "pg_loss", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "grad_norm",
                "entropy", "optimizer_steps"} | ({"kl"} if kl else set()) | (
        {"lopti_low_share", "dual_clip_frac"} if settings else set())
    assert set(plain_stats) == expected
    for key in plain_stats:
        assert plain_stats[key] == pytest.approx(fast_stats[key], rel=1e-4, abs=1e-6), key
    if settings:  # the later steps moved the ratio: a max over steps is above their mean
        assert plain_stats["ratio_max"] > 1.0


@pytest.mark.parametrize("loss_agg", PLAIN_LOSS_AGGS)
@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl"])
def test_the_plain_update_accumulates_micro_batches_exactly(loss_agg, kl):
    # update_policy(micro_batch=2): forwards and backwards of 2 rows summed into the mini-batch's gradient, the same
    # weights and stats as one forward of the whole mini-batch (micro_batch=None), for every loss aggregation
    settings = dict(alpha=0.3, lopti_eta=0.5, ppo_epochs=2, mini_batches=2, loss_agg=loss_agg, dual_clip=3.0)
    advantages = torch.tensor([1.0, -0.5, 0.0, 0.7, 0.0, 0.0, -1.2, 0.4])
    (whole_stats, whole), = both_updates(settings, advantages, kl=kl, paths=(False,), micro_batch=10**6)
    (chunked_stats, chunked), = both_updates(settings, advantages, kl=kl, paths=(False,), micro_batch=2)
    assert whole_stats["optimizer_steps"] == chunked_stats["optimizer_steps"] > 2
    for key in whole_stats:
        assert whole_stats[key] == pytest.approx(chunked_stats[key], rel=1e-5, abs=1e-7), key
    for key in whole:
        torch.testing.assert_close(whole[key], chunked[key], atol=1e-6, rtol=1e-5, msg=key)


def test_a_batch_with_nothing_to_learn_takes_no_step_on_either_path():
    # every advantage 0 and no KL: no pass has a gradient, so neither path steps (AdamW would move the weights)
    (plain_stats, plain), (fast_stats, fast) = both_updates(dict(lopti_eta=0.5), torch.zeros(8), kl=False)
    assert plain_stats["optimizer_steps"] == fast_stats["optimizer_steps"] == 0
    start = build_tiny_model(tiny_policy_and_rollouts()[0], hidden_size=32, num_layers=1, num_heads=2,
                             seed=0).state_dict()
    assert all(torch.equal(plain[k], start[k]) and torch.equal(fast[k], start[k]) for k in start)


@pytest.mark.parametrize("flag", [["--step-in-backward", "--grad-clip", "0", "--micro-batch", "512"],
                                  ["--logprob-fp32"], ["--loss-agg", "token-mean-per-micro-batch"]])
def test_no_fast_refuses_what_only_the_fast_update_does(flag, capsys):
    from harness.flags import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--no-fast", *flag])
    assert "are fast/update.py's only; give them or --no-fast, not both" in capsys.readouterr().err
    parse_args(flag)  # the fast path takes it


def settings_read(function_name, tree):
    """The Config fields a train.py function reads (config.<field>)."""
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function_name)
    return {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "config"}


def test_the_step_reads_an_allow_list_of_settings_and_no_speed_flag_shapes_the_plain_update():
    tree = ast.parse(open(os.path.join(REPO, "train.py")).read())
    assert settings_read("collect_rollouts", tree) == set(train.ROLLOUT_SETTINGS) == {
        "style", "num_generations", "max_new_tokens", "temperature", "top_p", "mask_truncated", "rollout_batch",
        "fast", "drop_finished_every", "fast_generate", "method", "tau", "dtype"}
    assert set(train.UPDATE_SETTINGS) == {"alpha", "lopti_eta", "lopti_order", "ppo_epochs", "mini_batches",
                                          "clip_low", "clip_high", "dual_clip", "kl_coef", "kl_clamp", "loss_agg",
                                          "grad_clip", "temperature", "micro_batch"}
    parameters = set(inspect.signature(train.update_policy).parameters)
    assert parameters == set(train.UPDATE_SETTINGS) | {"model", "optimizer", "input_ids", "attention_mask",
                                                       "completion_mask", "advantages", "ref_model", "norm_constant"}
    # micro_batch: rows per forward, the gradient accumulated exactly (a pasted update_policy scales)
    speed_and_memory = {"fast", "logit_chunk", "logprob_fp32", "step_in_backward", "dtype",
                        "gradient_checkpointing", "param_dtype", "optimizer_offload", "fast_generate"}
    assert not parameters & speed_and_memory
    assert "config" not in inspect.getsource(train.update_policy)


PASTE_SCRIPT = '''
import sys
sys.path.insert(0, ".")  # python -I leaves the folder off the path, and every site's path but the installed packages
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from update import update_policy

torch.manual_seed(0)
config = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config)
input_ids = torch.randint(0, 50, (6, 10))  # 6 rows: a 4-token prompt, then 6 completion tokens
attention_mask = torch.ones_like(input_ids)
completion_mask = torch.ones(6, 6)
completion_mask[0, 3:] = 0
advantages = torch.tensor([1.0, -1.0, 0.5, 0.0, -0.5, 0.2])
before = [p.detach().clone() for p in model.parameters()]
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
stats = update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages, alpha=0.3,
                      lopti_eta=0.5, mini_batches=2, micro_batch=2)
assert stats["optimizer_steps"] >= 2, stats
assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
assert not {name.split(".")[0] for name in sys.modules} & {"fast", "harness", "train"}, "a house module loaded"
print("pasted update ok", sorted(stats))
'''


def test_update_policy_pasted_alone_runs_with_the_lesson_files_it_names(tmp_path):
    # README: copy update_policy. Its source and train.py's imports of the lesson files, into update.py in an empty
    # folder beside those lesson files (rollout.py, ppo.py, lopti.py, softmax_grpo.py) and nothing else: one update
    # of a tiny random HF Llama with micro-batches runs there, and loads nothing of fast/ or harness/.
    import shutil
    import subprocess
    import sys
    source = open(os.path.join(REPO, "train.py")).read()
    lesson = ("rollout", "ppo", "lopti", "softmax_grpo")
    imports = [line for line in source.splitlines() if line.startswith("from ") and line.split()[1] in lesson]
    assert imports, "train.py imports the lesson files it uses"
    for name in lesson:
        shutil.copy(os.path.join(REPO, f"{name}.py"), tmp_path / f"{name}.py")
    (tmp_path / "update.py").write_text("import torch\n" + "\n".join(imports) + "\n\n\n"
                                        + inspect.getsource(train.update_policy))
    (tmp_path / "run_it.py").write_text(PASTE_SCRIPT)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", "run_it.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pasted update ok" in done.stdout
