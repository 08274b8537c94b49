#!/usr/bin/env bash
# SoftmaxGRPO on GSM8K: jeffhernandez1995/softmaxgrpo, softmaxgrpo/configs/gsm8k.yaml (over base.yaml):
# Qwen2.5-1.5B (base), tau 0.1, 64 prompts x 8 rollouts, 256 response tokens, 1000 steps, math-verify rewards.
# Data: GSM8K as JSONL with question/answer ("#### n"), or a folder with train.jsonl and test.jsonl:
#   GSM8K_DATA=data/gsm8k bash recipes/softmaxgrpo_gsm8k.sh          # (--dry-run: print the settings and exit)
# Memory (its plan: --dry-run --device cuda): peak 50.6 GB as written; fits 80 GB as written; 24 GB with --micro-batch 2 --optimizer-offload --param-dtype bf16 --rollout-batch 256
set -euo pipefail
cd "$(dirname "$0")/.."
args=(
  --model Qwen/Qwen2.5-1.5B
  --task gsm8k --data "${GSM8K_DATA:-data/gsm8k}"
  --task-option answer_style=boxed             # the official \boxed{} prompt (prepare_data.py), no <think> tags
  --method softmax --tau 0.1
  --num-generations 8 --prompts-per-step 64
  --max-new-tokens 256
  --temperature 1.0 --top-p 0.999
  --clip-low 0.2 --clip-high 0.28
  --kl-coef 1e-3 --kl-clamp 20
  --loss-agg token-mean-per-micro-batch --mini-batches 1 --ppo-epochs 1
  --lr 1e-6 --warmup-steps 0 --weight-decay 0.01 --grad-clip 1.0
  --steps 1000 --eval-every 25 --save-every 100
  --max-prompt-length 1024                      # max_prompt_length, filter_overlong_prompts
  --micro-batch 4
  --output-dir runs/softmaxgrpo_gsm8k
)
exec python train.py "${args[@]}" "$@"
