#!/usr/bin/env bash
# Advantage Reweighting + Lopti on Knights-and-Knaves with verl 0.9.x: FSDP actor + vLLM rollouts, GRPO advantages.
#
# NOT RUNNABLE IN THIS PROJECT'S CI: it needs CUDA GPUs (the paper: 4 x 80 GB for a 7B model), vLLM and the model
# weights. The pieces it plugs into verl (the `ar` policy loss, the Lopti trainer's two masked actor updates, the
# parquet files, the reward function) are tested on a CPU against the real verl in tests/test_integrations_verl.py.
# `DRY_RUN=1 bash recipes/verl_ar_lopti_kk.sh` composes and prints the full verl config without starting anything.
#
# Settings (DESIGN.md section 1; the AR-Lopti paper's K&K runs): GRPO (unbiased std, eps 1e-6), alpha = 0.3,
# eta = 0.5 with low-probability tokens first, clip 0.20 / 0.24, dual clip 10, k3 KL loss 1e-3 masked to each pass,
# token-mean over all valid tokens, AdamW lr 1e-6, weight decay 0.01, grad-norm clip 1.0, temperature 0.7, n = 8,
# 64 puzzles of 3-7 people per step, responses up to 4096 tokens, Logic-RL's -3..3 reward. Two optimizer steps per
# pass, as the fork's ppo_mini_batch_size 256 of 512 responses: verl 0.9 counts ppo_mini_batch_size in prompts and
# multiplies it by n, so 32 (64 would be one step). Not reproduced: the fork clamps low_var_kl's log-ratio at +-5,
# verl 0.9.1 at +-20 (not a setting).
# Lopti needs this file's entry point (python -m integrations.verl_plugin), which runs verl's v0 RayPPOTrainer with
# two actor updates per batch; AR alone (+algorithm.lopti_eta=0) also works with verl's own main_ppo.
# Multi-node: start a Ray cluster first and run this on the head node with NNODES set.
# verl 0.9's token-mean is over the mini-batch's tokens; the official runs (verl 0.6.1, the AR-Lopti fork) took
# each micro-batch's token mean and averaged them (train.py: --loss-agg token-mean-per-micro-batch).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct-1M}  # the paper's K&K model (also Qwen/Qwen2.5-3B-Instruct)
DATA=${DATA:-data/verl/knights_knaves}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
OUT=${OUT:-runs/verl-ar-lopti-kk}

if [ -z "${DRY_RUN:-}" ] && [ ! -f "$DATA/train.parquet" ]; then
  python -m integrations.verl_data --task knights_knaves --out "$DATA" --train 5000 --test 500 \
    --task-options '{"people": [3, 4, 5, 6, 7]}'
fi

python -m integrations.verl_plugin ${DRY_RUN:+--cfg job} \
  algorithm.adv_estimator=grpo \
  algorithm.norm_adv_by_std_in_grpo=true \
  algorithm.use_kl_in_reward=false \
  +algorithm.lopti_eta=0.5 \
  +algorithm.lopti_order=low-first \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=64 \
  data.max_prompt_length=400 \
  data.max_response_length=4096 \
  data.filter_overlong_prompts=true \
  reward.custom_reward_function.path=integrations/verl_data.py \
  reward.custom_reward_function.name=compute_score \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.strategy=fsdp \
  actor_rollout_ref.actor.policy_loss.loss_mode=ar \
  +actor_rollout_ref.actor.policy_loss.ar_alpha=0.3 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.clip_ratio_low=0.20 \
  actor_rollout_ref.actor.clip_ratio_high=0.24 \
  actor_rollout_ref.actor.clip_ratio_c=10.0 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.optim.weight_decay=0.01 \
  actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.fsdp_config.param_offload=true \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=true \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.fsdp_config.param_offload=true \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=0.7 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  trainer.n_gpus_per_node="$GPUS_PER_NODE" \
  trainer.nnodes="$NNODES" \
  trainer.total_epochs=5 \
  trainer.test_freq=20 \
  trainer.save_freq=20 \
  trainer.logger='[console]' \
  trainer.project_name=softmax-grpo-lopti \
  trainer.experiment_name=ar-lopti-kk \
  trainer.default_local_dir="$OUT" \
  "$@"
