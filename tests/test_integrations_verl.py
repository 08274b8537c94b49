"""integrations/verl_plugin.py and verl_data.py against the real verl 0.9.x, on a CPU.

Each check puts our function and verl's own entry point side by side: verl's compute_advantage with the
`softmaxgrpo` / `maxrl` estimators equals our group_advantages on the groups it was handed; verl's policy loss `ar`
equals our ppo.policy_loss after lopti.reweight_advantages (value and gradient); our parquet loads in verl's
RLHFDataset with a real tokenizer; verl's custom-reward loader returns task.reward; the Lopti trainer's
_update_actor sends the low pass then the high pass, and verl's actor loss on each equals ours with the KL masked.

verl pins transformers < 5.11, so these run in their own virtual environment (requirements-verl.txt; see the README,
"Beyond one GPU"). Without verl the module is skipped.
"""
import importlib.util
import json
import os
import re
import shlex
import string
import subprocess
import sys

import pytest

if importlib.util.find_spec("verl") is None:
    pytest.skip("verl is not installed; these tests run in the verl venv: pip install -r requirements-verl.txt "
                "(README, 'Beyond one GPU')", allow_module_level=True)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from integrations import verl_data, verl_plugin  # noqa: E402
from lopti import isolation_masks, reweight_advantages  # noqa: E402
from ppo import policy_loss  # noqa: E402
from softmax_grpo import group_advantages  # noqa: E402
from tasks import get_task  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERL_CONFIG_DIR = os.path.join(os.path.dirname(importlib.util.find_spec("verl").origin), "trainer", "config")


def actor_config(*overrides):
    """verl's ActorConfig built the way a launch builds it: hydra compose of ppo_trainer.yaml with command-line
    overrides, our prepare_config, then verl's omega_conf_to_dataclass."""
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        config = compose("ppo_trainer", overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                                   "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                                                   *overrides])
    return omega_conf_to_dataclass(verl_plugin.prepare_config(config).actor_rollout_ref.actor)


# ---------------------------------------------------------------------------------------------------------------
# advantage estimators through verl's compute_advantage
# ---------------------------------------------------------------------------------------------------------------
GROUPS = {"a": [1.0, 0.0, 0.0, 1.0], "b": [0.5, 2.0, 0.0], "single": [0.7], "same": [1.0, 1.0, 1.0, 1.0],
          "e": [0.0, 3.0]}


@pytest.mark.parametrize("estimator, method, algorithm", [("softmaxgrpo", "softmax", {"softmaxgrpo_tau": 1.0}),
                                                          ("maxrl", "maxrl", {})])
def test_compute_advantage_equals_group_advantages_on_shuffled_unequal_groups(estimator, method, algorithm):
    rows = [(uid, i, r) for uid, rewards in GROUPS.items() for i, r in enumerate(rewards)]
    order = np.random.default_rng(0).permutation(len(rows))  # groups interleaved, as after verl's batch balancing
    rows = [rows[k] for k in order]
    assert [uid for uid, _, _ in rows[:4]] != ["a"] * 4
    T = 6
    lengths = torch.tensor([1 + (3 * k) % T for k in range(len(rows))])
    response_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    token_level_rewards = torch.zeros(len(rows), T)
    token_level_rewards[torch.arange(len(rows)), lengths - 1] = torch.tensor([r for _, _, r in rows])  # last token
    data = DataProto.from_dict(tensors={"token_level_rewards": token_level_rewards, "response_mask": response_mask},
                               non_tensors={"uid": np.array([uid for uid, _, _ in rows], dtype=object)})

    out = compute_advantage(data, estimator, config=OmegaConf.create(algorithm))

    tau = algorithm.get("softmaxgrpo_tau", 0.1)
    ours = {uid: group_advantages(torch.tensor([rewards]), method, tau=tau)[0] if len(rewards) > 1 else [0.0]
            for uid, rewards in GROUPS.items()}  # one group at a time; a group of one gets 0
    expected = torch.tensor([float(ours[uid][i]) for uid, i, _ in rows])[:, None] * response_mask
    torch.testing.assert_close(out.batch["advantages"], expected)
    torch.testing.assert_close(out.batch["returns"], expected)
    if method == "softmax":  # hand check, tau = 1: rewards (0, 3) give -+ (e^3 - 1) / (e^3 + 1) = -+ tanh(1.5)
        e_rows = [k for k, (uid, _, _) in enumerate(rows) if uid == "e"]
        values = sorted(out.batch["advantages"][k, 0].item() for k in e_rows)  # token 0 is always valid
        assert values == pytest.approx([-np.tanh(1.5), np.tanh(1.5)], abs=1e-6)


def test_softmaxgrpo_without_tau_names_the_config_key():
    data = DataProto.from_dict(tensors={"token_level_rewards": torch.ones(2, 3), "response_mask": torch.ones(2, 3)},
                               non_tensors={"uid": np.array(["a", "a"], dtype=object)})
    with pytest.raises(ValueError, match="algorithm.softmaxgrpo_tau"):
        compute_advantage(data, "softmaxgrpo", config=OmegaConf.create({}))


# ---------------------------------------------------------------------------------------------------------------
# the `ar` policy loss
# ---------------------------------------------------------------------------------------------------------------
def test_ar_policy_loss_equals_our_loss_after_reweighting():
    alpha, clip_low, clip_high, dual_clip = 0.3, 0.2, 0.24, 10.0
    config = actor_config("actor_rollout_ref.actor.policy_loss.loss_mode=ar",
                          f"+actor_rollout_ref.actor.policy_loss.ar_alpha={alpha}",
                          f"actor_rollout_ref.actor.clip_ratio_low={clip_low}",
                          f"actor_rollout_ref.actor.clip_ratio_high={clip_high}",
                          f"actor_rollout_ref.actor.clip_ratio_c={dual_clip}")
    assert config.policy_loss.ar_alpha == alpha
    generator = torch.Generator().manual_seed(0)
    B, T = 8, 7
    response_mask = (torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 7, 1, 6, 4, 7])[:, None]).float()
    old_log_prob = -3.0 * torch.rand(B, T, generator=generator)
    log_ratio = 0.5 * torch.randn(B, T, generator=generator)
    log_ratio[1, :2] = 2.5  # ratio > dual_clip: exercises the dual clip on the negative-advantage row
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.0, 1.5])[:, None] * response_mask  # verl: [B, T]
    ratio = log_ratio.exp()
    valid = response_mask.bool()
    assert (valid & (advantages > 0) & (ratio > 1 + clip_high)).any()          # every branch of the loss is hit
    assert (valid & (advantages < 0) & (ratio < 1 - clip_low)).any()
    assert (valid & (advantages < 0) & (ratio > dual_clip)).any()

    verl_log_prob = (old_log_prob + log_ratio).requires_grad_()
    verl_loss, _ = get_policy_loss_fn("ar")(old_log_prob=old_log_prob, log_prob=verl_log_prob, advantages=advantages,
                                            response_mask=response_mask, loss_agg_mode="token-mean", config=config)
    verl_loss.backward()

    our_log_prob = (old_log_prob + log_ratio).requires_grad_()
    token_advantages = reweight_advantages(advantages, old_log_prob.exp(), response_mask, alpha)
    our_loss, _ = policy_loss(our_log_prob, old_log_prob, token_advantages, response_mask, clip_low=clip_low,
                              clip_high=clip_high, dual_clip=dual_clip)
    our_loss.backward()

    torch.testing.assert_close(verl_loss, our_loss)
    torch.testing.assert_close(verl_log_prob.grad, our_log_prob.grad)
    vanilla, _ = get_policy_loss_fn("vanilla")(old_log_prob, verl_log_prob.detach(), advantages, response_mask,
                                               "token-mean", config)
    assert abs(vanilla.item() - verl_loss.item()) > 1e-3  # alpha = 0.3 really changed the loss


# ---------------------------------------------------------------------------------------------------------------
# data and reward
# ---------------------------------------------------------------------------------------------------------------
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_parquet_loads_in_rlhf_dataset_with_a_real_tokenizer(tmp_path):
    from harness.tiny import build_char_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.tokenizer import hf_tokenizer

    tokenizer = build_char_tokenizer(string.printable)  # the tiny model's tokenizer, every printable character
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    tokenizer = hf_tokenizer(str(tmp_path / "tokenizer"))  # loaded as verl loads the model's tokenizer
    train, test = verl_data.write_task_parquets("countdown", str(tmp_path / "data"), 6, 3, seed=0)
    examples = get_task("countdown").examples("train", 6, seed=0)

    def dataset(path, max_prompt_length):
        config = OmegaConf.create({"max_prompt_length": max_prompt_length, "filter_overlong_prompts": True,
                                   "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache")})
        return RLHFDataset(path, tokenizer, config)

    train_set = dataset(train, 1024)
    assert len(train_set) == 6 and len(dataset(test, 1024)) == 3
    item = train_set[2]
    assert item["raw_prompt"] == get_task("countdown").prompt(examples[2], "chat")
    assert item["data_source"] == "softmax_grpo_lopti/countdown"
    assert json.loads(item["reward_model"]["ground_truth"]) == examples[2]
    ids = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert f"write an equation that equals {examples[2]['target']}" in tokenizer.decode(ids)
    assert len(dataset(train, len(ids) - 1)) < 6  # the length filter tokenizes with the chat template
    batch = collate_fn([train_set[0], train_set[1]])
    assert list(batch["data_source"]) == ["softmax_grpo_lopti/countdown"] * 2


@pytest.mark.parametrize("task_name, options", [("countdown", {}), ("knights_knaves", {"people": (3, 4)})])
def test_custom_reward_function_equals_task_reward(tmp_path, task_name, options):
    import pyarrow.parquet as pq
    from verl.trainer.ppo.reward import get_custom_reward_fn

    path = verl_data.write_parquet(verl_data.verl_rows(task_name, "test", 3, 1, **options), str(tmp_path / "t.parquet"))
    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": verl_data.__file__,
                                                                     "name": "compute_score"}}})
    compute_score = get_custom_reward_fn(config)  # verl loads the file by path, as in a launch
    task = get_task(task_name, **options)
    scores = []
    for row in pq.read_table(path).to_pylist():
        example = json.loads(row["reward_model"]["ground_truth"])
        completions = [task.solution(example, "chat"), "<think> no idea </think> <answer> 1 </answer>",
                       "no tags at all", "<answer>" * 50 + ")))("]
        for completion in completions:
            score = compute_score(data_source=row["data_source"], solution_str=completion,
                                  ground_truth=row["reward_model"]["ground_truth"], extra_info=row["extra_info"])
            assert score == task.reward(completion, example, style="chat")
            scores.append(score)
    assert len(set(scores)) >= 2 and max(scores) == (1.0 if task_name == "countdown" else 3.0)


# ---------------------------------------------------------------------------------------------------------------
# Lopti: the trainer's two actor updates
# ---------------------------------------------------------------------------------------------------------------
class RecordingWorkerGroup:
    """Stands in for actor_rollout_wg (remote GPU workers): records each update_actor batch."""

    def __init__(self):
        self.batches = []

    def update_actor(self, batch):
        self.batches.append(batch)
        metrics = {"mfu": 0.5, "pg_loss": [float(len(self.batches))], "lr": 1e-6}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


def lopti_batch(generator):
    """4 rows: left-padded prompts of 3, right-padded responses of 5, p_old on both sides of eta = 0.5."""
    B, P, T = 4, 3, 5
    prompt_mask = (torch.arange(P)[None, :] >= torch.tensor([0, 1, 2, 0])[:, None]).long()
    response_mask = (torch.arange(T)[None, :] < torch.tensor([5, 2, 4, 3])[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(5, 50, (B, P + T), generator=generator) * attention_mask
    old_log_probs = torch.log(torch.rand(B, T, generator=generator) * 0.98 + 0.01)
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5])[:, None] * response_mask
    return DataProto.from_dict(tensors={
        "input_ids": input_ids, "attention_mask": attention_mask, "prompts": input_ids[:, :P],
        "responses": input_ids[:, P:], "position_ids": (attention_mask.cumsum(1) - 1).clamp_min(0),
        "response_mask": response_mask, "old_log_probs": old_log_probs, "advantages": advantages,
        "ref_log_prob": old_log_probs + 0.3 * torch.randn(B, T, generator=generator)})


def flat_log_probs(response_log_probs, attention_mask, prompt_length):
    """The actor's no-padding output layout: per sequence, its valid tokens; token t's log-prob sits at t - 1."""
    pieces = []
    for row in range(attention_mask.shape[0]):
        prompt_len = int(attention_mask[row, :prompt_length].sum())
        response_len = int(attention_mask[row, prompt_length:].sum())
        pieces += [torch.zeros(prompt_len - 1), response_log_probs[row, :response_len], torch.zeros(1)]
    return torch.cat(pieces)


def test_lopti_update_actor_sends_low_then_high_pass_and_the_loss_masks_kl_to_the_pass():
    eta, kl_coef = 0.5, 0.1
    trainer = object.__new__(verl_plugin.LoptiRayPPOTrainer)  # no Ray, no GPUs: only _update_actor is exercised
    trainer.config = OmegaConf.create({
        "algorithm": {"lopti_eta": eta},
        "actor_rollout_ref": {"rollout": {"n": 2, "temperature": 0.7, "multi_turn": {"enable": False}},
                              "actor": {"calculate_entropy": False, "entropy_coeff": 0.0, "ppo_mini_batch_size": 2,
                                        "ppo_epochs": 1, "data_loader_seed": 0, "shuffle": False}}})
    trainer.actor_rollout_wg = RecordingWorkerGroup()
    batch = lopti_batch(torch.Generator().manual_seed(0))
    full = {key: batch.batch[key].clone() for key in batch.batch.keys()}

    output = trainer._update_actor(batch)

    low, high = isolation_masks(full["old_log_probs"].exp(), full["response_mask"], eta)
    assert low.any() and high.any()
    sent = trainer.actor_rollout_wg.batches
    assert len(sent) == 2
    for td, pass_mask in zip(sent, (low, high)):  # low-probability tokens first
        torch.testing.assert_close(td["advantages"], torch.where(pass_mask, full["advantages"], 0.0))
        assert torch.equal(td["lopti_kl_mask"].bool(), pass_mask)
        for key in ("old_log_probs", "ref_log_prob", "response_mask"):  # same old/ref log-probs, full mask
            assert torch.equal(td[key], full[key])
    assert torch.equal(batch.batch["advantages"], full["advantages"])  # the caller's batch is left as it was
    metrics = output.meta_info["metrics"]
    assert metrics["actor/pg_loss"] == [1.0, 2.0]
    assert metrics["actor/lopti_low_token_fraction"] == pytest.approx((low.sum() / full["response_mask"].sum()).item())

    # verl's actor loss on each pass (our lopti_ppo_loss wrapper) equals ours with kl_mask = the pass
    config = actor_config("actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.kl_loss_coef={kl_coef}",
                          "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.clip_ratio_c=10.0")
    P = full["prompts"].shape[1]
    current = full["old_log_probs"] + 0.2 * torch.randn(full["old_log_probs"].shape, generator=torch.Generator().manual_seed(1))
    for td, pass_mask in zip(sent, (low, high)):
        tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(full["response_mask"].sum()), global_batch_size=4)
        verl_log_prob = current.clone().requires_grad_()
        model_output = {"log_probs": flat_log_probs(verl_log_prob, full["attention_mask"], P)}
        verl_loss, verl_metrics = verl_plugin.lopti_ppo_loss(config, model_output, td)
        verl_loss.backward()
        our_log_prob = current.clone().requires_grad_()
        our_loss, stats = policy_loss(our_log_prob, full["old_log_probs"], td["advantages"], full["response_mask"],
                                      clip_low=config.clip_ratio_low, clip_high=config.clip_ratio_high,
                                      dual_clip=10.0, ref_logprobs=full["ref_log_prob"], kl_coef=kl_coef,
                                      kl_mask=pass_mask)
        our_loss.backward()
        torch.testing.assert_close(verl_loss, our_loss)
        torch.testing.assert_close(verl_log_prob.grad, our_log_prob.grad)
        assert our_log_prob.grad[full["response_mask"].bool() & ~pass_mask].abs().sum() < 1e-6  # A = 0 and no KL there
        n_pass = pass_mask.sum() / full["response_mask"].sum()
        assert verl_metrics["kl_loss"].aggregate() == pytest.approx(stats["kl"].item() * n_pass.item(), rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# The plug-in's wiring: VERL_USE_EXTERNAL_MODULES
# ---------------------------------------------------------------------------------------------------------------
def test_prepare_config_adds_the_plugin_after_the_users_modules(monkeypatch):
    from hydra import compose, initialize_config_dir
    key = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        in_config = compose("ppo_trainer", overrides=[f"++{key}='my_mod,other_mod'"])
        plain = compose("ppo_trainer")
    assert OmegaConf.select(verl_plugin.prepare_config(in_config), key) == "my_mod,other_mod,integrations.verl_plugin"
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "from_shell")  # set for the driver only: the workers need it too
    assert OmegaConf.select(verl_plugin.prepare_config(plain), key) == "from_shell,integrations.verl_plugin"


def test_a_module_listed_after_the_plugin_can_use_its_names_in_a_fresh_process():
    # a fresh Ray worker may import the plug-in first (unpickling its TaskRunner); verl then loads the listed modules
    # while the plug-in is half-imported, unless the plug-in keeps their order (verl_plugin.import_verl_in_order)
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "integrations.verl_plugin,tests.verl_cpu.uses_plugin"}
    proc = subprocess.run([sys.executable, "-c", "import integrations.verl_plugin, sys; "
                           "print(sys.modules['tests.verl_cpu.uses_plugin'].NAME)"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "grouped_advantages", proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# recipes/verl_*.sh: composed by verl's hydra and checked by its validate_config, at 1 and 2 nodes, and their values
# against DESIGN.md section 8 (the rows of the train.py recipe each reproduces)
# ---------------------------------------------------------------------------------------------------------------
VERL_RECIPES = {"verl_softmaxgrpo_countdown": "softmaxgrpo_countdown", "verl_ar_lopti_kk": "lopti_kk_ar_lopti"}
VERL_KEYS = {  # DESIGN.md key -> how to read it from the composed verl config
    "num_generations": lambda c: c.actor_rollout_ref.rollout.n,
    "prompts_per_step": lambda c: c.data.train_batch_size,
    "max_new_tokens": lambda c: c.data.max_response_length,
    "temperature": lambda c: c.actor_rollout_ref.rollout.temperature,
    "top_p": lambda c: c.actor_rollout_ref.rollout.top_p,
    "clip_low": lambda c: c.actor_rollout_ref.actor.clip_ratio_low,
    "clip_high": lambda c: c.actor_rollout_ref.actor.clip_ratio_high,
    "dual_clip": lambda c: (lambda cap: None if cap >= 1e8 else cap)(c.actor_rollout_ref.actor.clip_ratio_c),
    "kl_coef": lambda c: c.actor_rollout_ref.actor.kl_loss_coef,
    "lr": lambda c: c.actor_rollout_ref.actor.optim.lr,
    "alpha": lambda c: c.actor_rollout_ref.actor.policy_loss.get("ar_alpha"),
    "lopti_eta": lambda c: c.algorithm.get("lopti_eta"),
    "lopti_order": lambda c: c.algorithm.get("lopti_order"),
    "tau": lambda c: c.algorithm.get("softmaxgrpo_tau"),
    "method": lambda c: {"softmaxgrpo": "softmax"}.get(c.algorithm.adv_estimator, c.algorithm.adv_estimator),
    "steps": lambda c: c.trainer.total_training_steps,
    # verl 0.9 counts ppo_mini_batch_size in prompts (x n responses): optimizer steps per pass over the batch
    "mini_batches": lambda c: c.data.train_batch_size // c.actor_rollout_ref.actor.ppo_mini_batch_size,
}
VERL_KEYS["micro_batch"] = lambda c: c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
VERL_KEYS["max_prompt_length"] = lambda c: c.data.max_prompt_length if c.data.filter_overlong_prompts else None
VERL_KEYS["epochs"] = lambda c: c.trainer.total_epochs
# Not settings of verl 0.9.1 (the recipes say so): low_var_kl's log-ratio clamp is +-20 (the fork: 5), and its
# token-mean is over the mini-batch's tokens, not the mean of per-micro-batch means of verl 0.6.1 and the fork.
NOT_IN_VERL = {"kl_clamp", "loss_agg", "train_size"}  # train_size: verl's epochs run over the data file given


def verl_recipe_overrides(name, **env):
    """The hydra overrides of recipes/<name>.sh as bash would pass them, with its ${VAR:-default}s (env wins)."""
    text = open(os.path.join(REPO, "recipes", f"{name}.sh")).read()
    variables = {var: env.get(var, default) for var, default in re.findall(r"^(\w+)=\$\{\w+:-([^}]*)\}", text, re.M)}
    block = text.split("python -m integrations.verl_plugin ${DRY_RUN:+--cfg job} \\\n")[1].split('"$@"')[0]
    block = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), block)
    return shlex.split(block.replace("\\\n", " "), comments=True)


@pytest.mark.parametrize("nnodes", [1, 2])
@pytest.mark.parametrize("name", sorted(VERL_RECIPES))
def test_verl_recipe_composes_validates_and_matches_design(name, nnodes):
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        config = compose("ppo_trainer", overrides=verl_recipe_overrides(name, NNODES=str(nnodes)))
    config = verl_plugin.prepare_config(config)
    assert config.trainer.nnodes == nnodes
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    section = open(os.path.join(REPO, "DESIGN.md")).read().split("## 8.")[1]
    official = {key: json.loads(value) if value.strip()[0] in "-0123456789n[{" else value.strip()
                for recipe, key, value in re.findall(r"^\| (\w+) \| (\w+) \| ([^|]+?) \|$", section, re.M)
                if recipe == VERL_RECIPES[name]}
    checked = sorted(set(official) & set(VERL_KEYS))
    assert len(checked) >= 12 and set(official) - set(VERL_KEYS) - NOT_IN_VERL <= {"model", "task"}
    for key in checked:
        value = VERL_KEYS[key](config)
        assert value == (pytest.approx(official[key]) if isinstance(official[key], float) else official[key]), \
            f"{name}: {key} = {value!r}, DESIGN {official[key]!r}"


@pytest.mark.parametrize("overrides, message", [
    (["+algorithm.softmaxgrpo_tau=0"], "--tau must be > 0"),
    (["+algorithm.softmaxgrpo_tau=-1"], "--tau must be > 0"),
    (["+actor_rollout_ref.actor.policy_loss.ar_alpha=1.5"], "--alpha must lie in [0, 1]"),
    (["+actor_rollout_ref.actor.policy_loss.ar_alpha=-1"], "--alpha must lie in [0, 1]"),
    (["+algorithm.lopti_eta=5"], "--lopti-eta must lie in [0, 1]"),
    (["+algorithm.lopti_eta=-0.5"], "--lopti-eta must lie in [0, 1]"),
    (["+algorithm.lopti_eta=1"], "algorithm.lopti_eta must be < 1"),
])
def test_prepare_config_refuses_what_train_py_refuses(overrides, message):
    # verl's own validate_config accepted all of these; eta < 0 silently turned Lopti off, eta >= 1 ran an empty pass
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        verl_plugin.prepare_config(config)
