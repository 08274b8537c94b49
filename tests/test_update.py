"""train.update_policy, Algorithm 1's update, the one every run takes: micro-batches that add up exactly, its metrics,
no step where nothing can learn, its settings from one allow-list with harness/config.py's defaults, a learner's edit
(to it, to rollout.py's generate call and log-probs) that runs on a plain run, the paste the README describes."""
import ast
import copy
import importlib.util
import inspect
import os
import re
import sys

import pytest
import torch

import train
from harness.config import Config
from harness.tiny import build_tiny_model
from ppo import LOSS_AGGS
from tests.stubs import SMALL_TRAIN, tiny_policy_and_rollouts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHOLE_LOSS_AGGS = [agg for agg in LOSS_AGGS if agg != "token-mean-per-micro-batch"]  # micro_batch leaves them alone
ADVANTAGES = torch.tensor([1.0, -0.5, 0.0, 0.7, 0.0, 0.0, -1.2, 0.4])


def one_update(settings, advantages, *, kl, micro_batch=3):
    """(stats, weights) of one update (SGD, lr 0.5) of the tiny policy on the same 8 rollouts."""
    tokenizer, _, r = tiny_policy_and_rollouts()
    r.completion_mask[1, 2:] = 0  # unequal lengths, so that the aggregations differ
    r.attention_mask[1, -4:] = 0
    policy = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    ref_model = copy.deepcopy(policy).eval() if kl else None
    with torch.no_grad():  # the reference apart from the policy, so that the k3 term has a gradient
        for parameter in (ref_model.parameters() if kl else []):
            parameter.add_(0.01 * torch.randn_like(parameter))
    config = Config(**settings, kl_coef=0.1 if kl else 0.0, micro_batch=micro_batch, max_new_tokens=6, dtype="fp32")
    stats = train.update_batch(policy, torch.optim.SGD(policy.parameters(), lr=0.5), r.input_ids, r.attention_mask,
                               r.completion_mask, advantages, config, ref_model=ref_model)
    return stats, {k: v.detach().clone() for k, v in policy.state_dict().items()}


@pytest.mark.parametrize("settings", [dict(alpha=0.3, lopti_eta=0.5, ppo_epochs=2, mini_batches=2, dual_clip=3.0),
                                      dict()], ids=["ar-lopti-2x2", "one-step"])
@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl"])
def test_the_update_returns_its_metrics(settings, kl):
    # ratio_max is the max over every step (not a mean of maxima); the loss's stats merged over the micro-batches
    stats, _ = one_update(settings, ADVANTAGES, kl=kl)
    expected = {"loss", "pg_loss", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "grad_norm",
                "entropy", "optimizer_steps"} | ({"kl"} if kl else set()) | (
        {"lopti_low_share", "dual_clip_frac"} if settings else set())
    assert set(stats) == expected and all(isinstance(value, (int, float)) for value in stats.values())
    assert stats["entropy"] > 0
    if settings:  # the later steps moved the ratio: a max over steps is above their mean
        assert stats["ratio_max"] > 1.0 and stats["optimizer_steps"] > 2
    else:  # on-policy: one step at pi_old's weights, ratio exactly 1, nothing clipped
        assert stats["ratio_max"] == 1.0 and stats["optimizer_steps"] == 1 and stats["clip_frac_low"] == 0


@pytest.mark.parametrize("loss_agg", WHOLE_LOSS_AGGS)
@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl"])
def test_the_update_accumulates_micro_batches_exactly(loss_agg, kl):
    # update_policy(micro_batch=2): forwards and backwards of 2 rows summed into the mini-batch's gradient, the same
    # weights and stats as one forward of the whole mini-batch (micro_batch=None), for every loss aggregation
    settings = dict(alpha=0.3, lopti_eta=0.5, ppo_epochs=2, mini_batches=2, loss_agg=loss_agg, dual_clip=3.0)
    whole_stats, whole = one_update(settings, ADVANTAGES, kl=kl, micro_batch=10**6)
    chunked_stats, chunked = one_update(settings, ADVANTAGES, kl=kl, micro_batch=2)
    assert whole_stats["optimizer_steps"] == chunked_stats["optimizer_steps"] > 2
    for key in whole_stats:
        assert whole_stats[key] == pytest.approx(chunked_stats[key], rel=1e-5, abs=1e-7), key
    for key in whole:
        torch.testing.assert_close(whole[key], chunked[key], atol=1e-6, rtol=1e-5, msg=key)


def test_a_batch_with_nothing_to_learn_takes_no_step():
    # every advantage 0 and no KL: no pass has a gradient, so no step (AdamW would move the weights)
    stats, weights = one_update(dict(lopti_eta=0.5), torch.zeros(8), kl=False)
    assert stats["optimizer_steps"] == 0
    start = build_tiny_model(tiny_policy_and_rollouts()[0], hidden_size=32, num_layers=1, num_heads=2,
                             seed=0).state_dict()
    assert all(torch.equal(weights[k], start[k]) for k in start)


def settings_read(function_name, tree):
    """The Config fields a train.py function reads (config.<field>)."""
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function_name)
    return {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "config"}


def test_the_step_reads_an_allow_list_of_settings_whose_defaults_are_the_lessons():
    # python train.py passes every UPDATE_SETTING from harness/config.py: an edit of a default in update_policy alone
    # would change nothing there, so the two are held equal
    tree = ast.parse(open(os.path.join(REPO, "train.py")).read())
    assert settings_read("collect_rollouts", tree) == set(train.ROLLOUT_SETTINGS) == {
        "style", "num_generations", "max_new_tokens", "temperature", "top_p", "mask_truncated", "rollout_batch",
        "fast_generate", "method", "tau", "dtype"}
    parameters = inspect.signature(train.update_policy).parameters
    assert set(parameters) == set(train.UPDATE_SETTINGS) | {
        "model", "optimizer", "input_ids", "attention_mask", "completion_mask", "advantages", "ref_model",
        "norm_constant", "old_logprobs", "autocast_dtype", "clock"}
    for name in train.UPDATE_SETTINGS:
        assert parameters[name].default == getattr(Config(), name), \
            f"update_policy's {name}={parameters[name].default!r}; harness/config.py's, which runs, is " \
            f"{getattr(Config(), name)!r}: change both"
    names = {node.id for node in ast.walk(ast.parse(inspect.getsource(train.update_policy))) if isinstance(node, ast.Name)}
    assert "config" not in names  # explicit arguments: no run settings object


@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl"])
def test_micro_batches_add_up_to_one_forward_of_the_mini_batch(loss_agg, kl, one_thread):
    # loss = sum(token_weights * l) over the mini-batch, its weights set once for all its rows (per micro-batch of 3
    # rows for token-mean-per-micro-batch); written out here in one forward, its gradient is what update_policy's
    # forwards of 3 rows at a time accumulate: one SGD step of lr 1 moves the weights by minus that gradient
    from ppo import policy_loss, token_weights
    from rollout import token_logprobs
    tokenizer, _, r = tiny_policy_and_rollouts()
    r.completion_mask[1, 2:] = 0  # unequal lengths, so that the aggregations differ
    r.attention_mask[1, -4:] = 0
    advantages = torch.tensor([1.0, -0.5, 0.0, 0.7, 0.0, 0.0, -1.2, 0.4])
    fresh = lambda: build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)  # noqa: E731
    whole, policy = fresh(), fresh()
    ref_model = copy.deepcopy(whole).eval() if kl else None
    with torch.no_grad():
        for parameter in (ref_model.parameters() if kl else []):
            parameter.add_(0.01 * torch.randn_like(parameter))
    ref = token_logprobs(ref_model, r.input_ids, r.attention_mask, r.completion_mask).detach() if kl else None
    logprobs = token_logprobs(whole, r.input_ids, r.attention_mask, r.completion_mask)  # all 8 rows at once
    weights = token_weights(r.completion_mask, loss_agg, 6, micro_batch=3)
    policy_loss(logprobs, logprobs.detach(), advantages, r.completion_mask, weights=weights, ref_logprobs=ref,
                kl_coef=0.1)[0].backward()
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    train.update_policy(policy, torch.optim.SGD(policy.parameters(), lr=1.0), r.input_ids, r.attention_mask,
                        r.completion_mask, advantages, ref_model=ref_model, kl_coef=0.1, loss_agg=loss_agg,
                        norm_constant=6, micro_batch=3, grad_clip=1e9)
    for name, parameter in whole.named_parameters():
        torch.testing.assert_close(policy.get_parameter(name).detach() - before[name], -parameter.grad, atol=1e-6,
                                   rtol=1e-4, msg=name)


def edited(tmp_path, module, function_name, monkeypatch):
    """The lesson file `module` copied with a print added as the first line of `function_name`'s body, imported
    under its own name (the copy of train.py then imports it)."""
    source = open(os.path.join(REPO, f"{module}.py")).read()
    function = next(node for node in ast.parse(source).body if getattr(node, "name", "") == function_name)
    lines = source.splitlines(keepends=True)
    first = function.body[1].lineno - 1  # the line after the docstring
    indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
    (tmp_path / f"{module}.py").write_text("".join(lines[:first] + [f'{indent}print("edit ran: {function_name}")\n']
                                                   + lines[first:]))
    spec = importlib.util.spec_from_file_location(module, tmp_path / f"{module}.py")
    copy_ = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module, copy_)
    spec.loader.exec_module(copy_)
    return copy_


@pytest.mark.parametrize("module, function_name, per_step", [("train", "update_policy", 1),
                                                             ("rollout", "sample_completions", 1),
                                                             ("rollout", "token_logprobs", 1)])
def test_a_learners_edit_to_the_lesson_runs_on_a_plain_run(tmp_path, digits_task, capsys, monkeypatch, module,
                                                           function_name, per_step):
    # the lesson's update_policy, generate call and log-probs are what `python train.py` runs (381f0cf sampled and
    # scored through fast/): a copy with a print added prints it on a plain run, at least once a step
    edited(tmp_path, module, function_name, monkeypatch)
    trainer = sys.modules["train"] if module == "train" else edited(tmp_path, "train", "main", monkeypatch)
    trainer.main(["--task", "digits", "--output-dir", str(tmp_path / "run"), *SMALL_TRAIN, "--steps", "2"])
    assert capsys.readouterr().out.count(f"edit ran: {function_name}") >= 2 * per_step


# --- the paste README.md describes ------------------------------------------------------------------------------
PASTE_SCRIPT = """
import sys
sys.path.insert(0, ".")  # python -I leaves the folder off the path, and every site's path but the installed packages
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from rollout import evaluate
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
                      lopti_eta=0.5, mini_batches=2, micro_batch=2)  # AR, Lopti: a pi_old forward
assert stats["optimizer_steps"] >= 2, stats
stats = update_policy(model, optimizer, input_ids, attention_mask, completion_mask, advantages, micro_batch=4,
                      loss_agg="token-mean-per-micro-batch")  # the on-policy rule: no pi_old forward
assert stats["optimizer_steps"] == 1, stats
assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

vocab = {c: i for i, c in enumerate(["<pad>", "<bos>", "<eos>", "<unk>"] + list("0123456789+>:"))}
core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\\\s\\\\S]"), behavior="isolated")
core.decoder = decoders.Fuse()
core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                    unk_token="<unk>", padding_side="left")


class Sum:  # a task: the rollout calls need its name, pass_threshold, prompt and reward
    name, pass_threshold = "sum", 1.0
    def prompt(self, example, style):
        return example["text"]
    def reward(self, text, example, style):
        return float(text.strip() == example["answer"])


result = evaluate(model, tokenizer, Sum(), [{"text": "1+2>", "answer": "3"}] * 3, style="compact", max_new_tokens=3)
assert set(result) >= {"pass@1", "reward"}, result
assert not {name.split(".")[0] for name in sys.modules} & {"fast", "harness", "train"}, "a house module loaded"
print("pasted update ok", sorted(stats))
"""


def test_the_paste_the_readme_names_runs_alone(tmp_path):
    # README.md's "Paste" sentence names files and, from two files, functions: exactly those, into an empty folder
    # (the functions into update.py under train.py's imports of the lesson files), run two updates (a pi_old forward,
    # and the on-policy rule) and rollout.evaluate's default there, and load nothing of fast/, harness/ or train.py
    import shutil
    import subprocess
    import sys
    readme = " ".join(open(os.path.join(REPO, "README.md")).read().split())
    paste = re.search(r"Paste the files (.*?): a test runs exactly that", readme).group(1)
    files = re.findall(r"`(\w+\.py)`", paste)
    functions = {module: re.findall(r"`(\w+)`", names)
                 for module, names in re.findall(r"from ([\w/]+\.py) ((?:`\w+`,? ?)+)", paste)}
    assert files == ["rollout.py", "ppo.py", "lopti.py", "softmax_grpo.py"] and set(functions) == {
        "train.py"}, (files, functions)
    for name in files:
        shutil.copy(os.path.join(REPO, name), tmp_path / name)
    source = open(os.path.join(REPO, "train.py")).read()
    lesson = [name.removesuffix(".py") for name in files]
    imports = [line for line in source.splitlines() if line.startswith("from ") and line.split()[1] in lesson]
    modules = {"train.py": train}
    pasted = [inspect.getsource(getattr(modules[module], name)) for module in functions
              for name in functions[module]]
    (tmp_path / "update.py").write_text("import contextlib\nimport torch\n" + "\n".join(imports) + "\n\n\n"
                                        + "\n\n".join(pasted))
    (tmp_path / "run_it.py").write_text(PASTE_SCRIPT)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", "run_it.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pasted update ok" in done.stdout
