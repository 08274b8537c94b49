#!/usr/bin/env bash
# SoftmaxGRPO on Countdown with verl 0.9.x: FSDP actor + vLLM rollouts, on NNODES nodes x GPUS_PER_NODE GPUs.
#
# NOT RUNNABLE IN THIS PROJECT'S CI: it needs CUDA GPUs, vLLM and the model weights. The pieces it plugs into verl
# (the softmaxgrpo estimator, the parquet files, the reward function) are tested on a CPU against the real verl in
# tests/test_integrations_verl.py. `DRY_RUN=1 bash recipes/verl_softmaxgrpo_countdown.sh` composes and prints the
# full verl config without starting anything (works on a CPU machine with requirements-verl.txt installed).
#
# Settings (DESIGN.md section 1; the official SoftmaxGRPO Countdown config): tau = 0.1, M = 8 completions,
# 64 prompts per step, one optimizer step per batch, clip 0.20 / 0.28 with no dual clip, token-mean loss, k3 KL to
# the reference as a loss term with coefficient 1e-3 (none in the reward), AdamW lr 1e-6, rollout temperature 1.0,
# top_p 0.999, responses up to 256 tokens, 2 000 steps (DESIGN.md section 8, row softmaxgrpo_countdown).
# Multi-node: start a Ray cluster first (`ray start --head` on one node, `ray start --address=HEAD:6379` on the
# others) and run this on the head node with NNODES set.
#
#   pip install -r requirements-verl.txt vllm   # a CUDA machine; vLLM must match verl's supported versions
#   bash recipes/verl_softmaxgrpo_countdown.sh [more hydra overrides, e.g. trainer.logger='[console,wandb]']
# verl 0.9's token-mean is over the mini-batch's tokens; the official runs (verl 0.6.1, the AR-Lopti fork) took
# each micro-batch's token mean and averaged them (train.py: --loss-agg token-mean-per-micro-batch).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

MODEL=${MODEL:-Qwen/Qwen2.5-1.5B}            # the official Countdown run's model; any HF causal LM works
DATA=${DATA:-data/verl/countdown}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
OUT=${OUT:-runs/verl-softmaxgrpo-countdown}

if [ -z "${DRY_RUN:-}" ] && [ ! -f "$DATA/train.parquet" ]; then
  python -m integrations.verl_data --task countdown --out "$DATA" --train 20000 --test 512
fi

python -m integrations.verl_plugin ${DRY_RUN:+--cfg job} \
  algorithm.adv_estimator=softmaxgrpo \
  +algorithm.softmaxgrpo_tau=0.1 \
  algorithm.use_kl_in_reward=false \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=64 \
  data.max_prompt_length=1024 \
  data.max_response_length=256 \
  data.filter_overlong_prompts=true \
  reward.custom_reward_function.path=integrations/verl_data.py \
  reward.custom_reward_function.name=compute_score \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.strategy=fsdp \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.clip_ratio_low=0.20 \
  actor_rollout_ref.actor.clip_ratio_high=0.28 \
  actor_rollout_ref.actor.clip_ratio_c=1.0e9 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.optim.weight_decay=0.01 \
  actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.top_p=0.999 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
  trainer.n_gpus_per_node="$GPUS_PER_NODE" \
  trainer.nnodes="$NNODES" \
  trainer.total_training_steps=2000 \
  trainer.total_epochs=1000 \
  trainer.test_freq=25 \
  trainer.save_freq=100 \
  trainer.logger='[console]' \
  trainer.project_name=softmax-grpo-lopti \
  trainer.experiment_name=softmaxgrpo-countdown \
  trainer.default_local_dir="$OUT" \
  "$@"
