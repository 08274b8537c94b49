"""The verl plug-in, end to end through verl 0.9.x's own Ray trainer, on a CPU (slow: ~2 minutes per launch).

Two launches on a tiny Llama with a chat template and Countdown parquet files, each for 2 training steps:
  1. the plug-in's entry point (`python -m integrations.verl_plugin`): SoftmaxGRPO tau 0.1, the `ar` loss with alpha
     0.3, Lopti with eta = 1 / vocabulary size (so that an untrained model has tokens on both sides of it), k3 KL loss;
  2. verl's own `main_ppo` with the plug-in as an external module: MaxRL and the `ar` loss.
Everything verl really runs does run: its RayPPOTrainer (v0), the FSDP2 engine with a reference model, the agent
loop, the reward loop and the weight sync to the rollout. What a GPU machine adds is swapped for test-only stand-ins
(tests/verl_cpu: a "cpu" platform, and HF generate as the rollout server instead of vLLM). The assertions read a
trace that every Ray process appends to (tests/verl_cpu/trace.py), so they check what ran, where it ran.

Run in the verl virtual environment: `.venv-verl/bin/python -m pytest -q -m slow tests/test_verl_end_to_end.py`.
"""
import importlib.util
import json
import os
import shutil
import string
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import pytest

if importlib.util.find_spec("verl") is None:
    pytest.skip("verl is not installed; this runs in the verl venv (requirements-verl.txt, docs/scale-out.md)",
                allow_module_level=True)

import torch  # noqa: E402

from softmax_grpo import group_advantages  # noqa: E402

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
STEPS, PROMPTS, M = 2, 2, 2


@pytest.fixture(scope="module")
def workspace():
    """A short folder (Ray's socket paths have a length limit): model/ (a tiny Llama with a chat template, every
    printable character a token) and data/ (Countdown train.parquet and test.parquet, in verl's format)."""
    from integrations import verl_data
    from harness.tiny import build_char_tokenizer, build_tiny_model
    work = tempfile.mkdtemp(prefix="ve", dir="/tmp")
    tokenizer = build_char_tokenizer(string.printable)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, max_positions=1024, seed=0)
    model.save_pretrained(os.path.join(work, "model"))
    tokenizer.save_pretrained(os.path.join(work, "model"))
    verl_data.write_task_parquets("countdown", os.path.join(work, "data"), 8, 4, seed=0)
    yield {"path": work, "vocab": len(tokenizer)}
    shutil.rmtree(work, ignore_errors=True)


def launch(work, name, overrides, *, main_ppo=False, timeout=900):
    """Run tests.verl_cpu.launch; -> (trace events by name, seconds, the process's output)."""
    trace = os.path.join(work, f"{name}.trace.jsonl")
    common = [
        f"data.train_files={work}/data/train.parquet", f"data.val_files={work}/data/test.parquet",
        f"data.train_batch_size={PROMPTS}", "data.val_batch_size=4", "data.max_prompt_length=1024",
        "data.max_response_length=16", "data.filter_overlong_prompts=false", "data.dataloader_num_workers=0",
        "reward.custom_reward_function.path=tests/verl_cpu/reward.py",
        "reward.custom_reward_function.name=compute_score", "reward.num_workers=1",
        f"actor_rollout_ref.model.path={work}/model", "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.policy_loss.loss_mode=ar", "+actor_rollout_ref.actor.policy_loss.ar_alpha=0.3",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={PROMPTS * M}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={PROMPTS * M}",
        "actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.rollout.n={M}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={PROMPTS * M}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.resume_mode=disable", "trainer.logger=[console]", "trainer.project_name=verl-cpu",
        f"trainer.experiment_name={name}", f"trainer.default_local_dir={work}/{name}-checkpoints",
        "ray_kwargs.ray_init.num_cpus=8", "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=false", f"+ray_kwargs.ray_init._temp_dir={work}/ray",
        f"hydra.run.dir={work}/{name}-hydra"]  # hydra's own log folder: the scratch folder, not ./outputs
    env = {**os.environ, "VERL_CPU_TRACE": trace, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "HYDRA_FULL_ERROR": "1", "RAY_DEDUP_LOGS": "0", "PYTHONPATH": REPO}
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "tests.verl_cpu.launch", *(["--main-ppo"] * main_ppo), *common,
                           *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.time() - start
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    events = defaultdict(list)
    for line in open(trace):
        row = json.loads(line)
        events[row["event"]].append(row)
    return events, seconds, proc.stdout + proc.stderr


def check_advantages(rows, method, **options):
    """Each traced estimator call: finite, and equal to group_advantages on the groups verl handed it (by uid)."""
    assert rows
    for row in rows:
        assert row["finite"]
        groups = defaultdict(list)
        for i, uid in enumerate(row["uids"]):
            groups[uid].append(i)
        assert sorted(len(g) for g in groups.values()) == [M] * PROMPTS  # the right groups: M rows per prompt
        for members in groups.values():
            scores = torch.tensor([[row["scores"][i] for i in members]])
            expected = group_advantages(scores, method, **options)[0]
            got = torch.tensor([row["advantages"][i] for i in members])
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_plugin_entry_point_trains_softmaxgrpo_ar_lopti_and_kl(workspace):
    eta = 1.0 / workspace["vocab"]
    events, seconds, output = launch(workspace["path"], "lopti", [
        "algorithm.adv_estimator=softmaxgrpo", "+algorithm.softmaxgrpo_tau=0.1", f"+algorithm.lopti_eta={eta}",
        "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.clip_ratio_c=10.0"])
    print(f"plug-in entry point: {seconds:.0f} s")
    driver = {row["pid"] for row in events["trainer:update_actor"]}
    # the Lopti loss is installed on the worker (another process than the trainer's; verl installs its own first),
    # and every loss call of training ran it and saw the pass's KL mask
    installs = events["worker:set_loss_fn"]
    assert installs[-1]["loss_fn"].endswith("lopti_ppo_loss") and not {row["pid"] for row in installs} & driver
    losses = events["worker:loss_fn"]
    assert losses and all(row["loss_fn"].endswith("lopti_ppo_loss") and row["has_lopti_kl_mask"] for row in losses)
    # each step: two actor updates, the low pass first; their tokens add up to the response tokens
    updates = events["trainer:update_actor"]
    assert [row["step"] for row in updates] == [s for s in range(1, STEPS + 1) for _ in range(2)]
    for low, high in zip(updates[::2], updates[1::2]):
        assert low["pass_tokens"] == low["low_tokens_in_pass"] > 0 and high["low_tokens_in_pass"] == 0
        assert high["pass_tokens"] > 0 and low["pass_tokens"] + high["pass_tokens"] == low["response_tokens"]
    # softmaxgrpo on the right groups, equal to our group_advantages of the scores verl logged; ar with its alpha
    check_advantages(events["registry:softmaxgrpo"], "softmax", tau=0.1)
    assert len(events["registry:softmaxgrpo"]) == STEPS
    assert events["registry:ar"] and all(row["alpha"] == 0.3 for row in events["registry:ar"])
    # the trained weights reached the rollout after each step
    loads = events["rollout:load_weights"]
    assert sum(row["changed"] > 0 for row in loads) >= STEPS and not any(row["missing"] for row in loads)
    assert len(events["rollout:generate"]) >= STEPS * PROMPTS * M


def test_verl_main_ppo_trains_maxrl_with_the_ar_loss(workspace):
    events, seconds, output = launch(workspace["path"], "maxrl", [
        "algorithm.adv_estimator=maxrl", "trainer.use_v1=false", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.policy_loss._target_=integrations.verl_plugin.ARPolicyLossConfig"], main_ppo=True)
    print(f"verl main_ppo: {seconds:.0f} s")
    check_advantages(events["registry:maxrl"], "maxrl")
    assert len(events["registry:maxrl"]) == STEPS
    assert events["registry:ar"] and all(row["alpha"] == 0.3 for row in events["registry:ar"])
    assert [row["step"] for row in events["trainer:update_actor"]] == list(range(1, STEPS + 1))  # no Lopti here
    assert sum(row["changed"] > 0 for row in events["rollout:load_weights"]) >= STEPS
