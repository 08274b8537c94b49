#!/usr/bin/env bash
# SoftmaxGRPO on DeepMath-103K: jeffhernandez1995/softmaxgrpo, softmaxgrpo/configs/deepmath.yaml (over base.yaml):
# Qwen2.5-1.5B (base), tau 0.3, 512 prompts x 16 rollouts, 1024 response tokens, 3220 steps (2 nodes officially).
# On one GPU this is days per hundred steps: lower --prompts-per-step for a first look (a deviation; say so).
# Data: rows with question / final_answer (JSONL or parquet):
#   DEEPMATH_DATA=data/deepmath.parquet bash recipes/softmaxgrpo_deepmath.sh     # (--dry-run: print and exit)
# Memory (its plan: --dry-run --device cuda): peak 92.9 GB as written; fits 80 GB with --micro-batch 4 --rollout-batch 256; 24 GB with --gradient-checkpointing --optimizer-offload --param-dtype bf16 --rollout-batch 128
set -euo pipefail
cd "$(dirname "$0")/.."
args=(
  --model Qwen/Qwen2.5-1.5B
  --task deepmath --data "${DEEPMATH_DATA:-data/deepmath}"
  --task-option answer_style=boxed             # the official \boxed{} prompt (prepare_data.py), no <think> tags
  --method softmax --tau 0.3
  --num-generations 16 --prompts-per-step 512
  --max-new-tokens 1024
  --temperature 1.0 --top-p 0.999
  --clip-low 0.2 --clip-high 0.28
  --kl-coef 1e-3 --kl-clamp 20
  --loss-agg token-mean-per-micro-batch --mini-batches 1 --ppo-epochs 1
  --lr 1e-6 --warmup-steps 0 --weight-decay 0.01 --grad-clip 1.0
  --steps 3220 --eval-every 25 --save-every 100
  --max-prompt-length 1024                      # max_prompt_length, filter_overlong_prompts
  --micro-batch 8 --rollout-batch 1024
  --output-dir runs/softmaxgrpo_deepmath
)
exec python train.py "${args[@]}" "$@"
