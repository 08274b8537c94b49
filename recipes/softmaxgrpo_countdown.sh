#!/usr/bin/env bash
# SoftmaxGRPO on Countdown, as the paper ran it: jeffhernandez1995/softmaxgrpo, softmaxgrpo/configs/countdown.yaml
# (over base.yaml): Qwen2.5-1.5B (base), tau 0.1, 64 prompts x 8 rollouts, 256 response tokens, 2000 steps.
# The official run used 8 GPUs with vLLM (see recipes/verl_* for that launch).
#   bash recipes/softmaxgrpo_countdown.sh                 # train
#   bash recipes/softmaxgrpo_countdown.sh --dry-run       # print the resolved settings and exit
# Any flag after the script's name overrides the recipe's (argparse: the last one wins).
# Memory (its plan: --dry-run --device cuda): peak 50.6 GB as written; fits 80 GB as written; 24 GB with --micro-batch 2 --optimizer-offload --param-dtype bf16 --rollout-batch 256
set -euo pipefail
cd "$(dirname "$0")/.."
args=(
  --model Qwen/Qwen2.5-1.5B                     # actor_rollout_ref.model.path
  --task countdown --task-option rules=softmaxgrpo   # the official reward rules (rewards.py)
  --method softmax --tau 0.1                    # algorithm.adv_estimator / softmaxgrpo_tau
  --num-generations 8 --prompts-per-step 64     # rollout.n, data.train_batch_size
  --max-new-tokens 256                          # data.max_response_length
  --temperature 1.0 --top-p 0.999               # rollout.temperature / top_p (top_k off)
  --clip-low 0.2 --clip-high 0.28               # clip_ratio_low / high; clip_ratio_c 1e9 = no dual clip
  --kl-coef 1e-3 --kl-clamp 20                  # kl_loss_coef, low_var_kl (verl clamps the log-ratio to +-20)
  --loss-agg token-mean-per-micro-batch --mini-batches 1 --ppo-epochs 1   # ppo_mini_batch_size = train_batch_size
  --lr 1e-6 --warmup-steps 0 --weight-decay 0.01 --grad-clip 1.0   # verl's AdamW defaults
  --steps 2000 --eval-every 25 --save-every 100 # total_training_steps, test_freq, save_freq
  --max-prompt-length 1024                      # max_prompt_length, filter_overlong_prompts
  --micro-batch 4                               # ppo_micro_batch_size_per_gpu: each one's token mean, averaged
  --output-dir runs/softmaxgrpo_countdown
)
exec python train.py "${args[@]}" "$@"
