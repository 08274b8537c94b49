#!/usr/bin/env bash
# Advantage Reweighting alone on Knights and Knaves (GRPO advantages), as zhyang2226/AR-Lopti scripts/train_kklogic_AR_4x80GB.sh
# ran it with Qwen2.5-3B-Instruct (the script's other model option): 64 prompts x 8 rollouts at temperature 0.7,
# 4096 response tokens, clip 0.2 / 0.24, dual clip 10, k3 KL 1e-3 (log-ratio clamped to +-5), and two optimizer
# steps per pass (ppo_mini_batch_size 256 of 512 responses; with Lopti, four per RL step). The official run is
# 5 epochs over Logic-RL's 3-7 people set (4 500 puzzles, prompts over 400 tokens left out): here 5 epochs over
# 4 500 generated puzzles, 350 steps (or the official files themselves with --data).
#   bash recipes/lopti_kk_ar.sh            # (--dry-run: print the resolved settings and exit)
# Memory (its plan: --dry-run --device cuda): peak 254.1 GB as written; fits 80 GB with --gradient-checkpointing --micro-batch 2 --param-dtype bf16 --rollout-batch 64; 24 GB with --gradient-checkpointing --lora-rank 16 --micro-batch 1 --rollout-batch 32
set -euo pipefail
cd "$(dirname "$0")/.."
args=(
  --model Qwen/Qwen2.5-3B-Instruct
  --task knights_knaves --task-option 'people=[3,4,5,6,7]' --task-option rules=logic_rl   # merge_34567ppl, kk.py
  --task-option think_prefill=true              # the prompt ends in <think>; scored on it + the completion, as kk.py
  --method grpo                                 # ALGO=grpo (unbiased std, eps 1e-6)
  --alpha 0.2 --lopti-eta 0                   # REWEIGHT_K (alpha); no separate updating
  --num-generations 8 --prompts-per-step 64     # ROLLOUT_N, TRAIN_BS
  --max-new-tokens 4096                         # data.max_response_length
  --temperature 0.7 --top-p 1.0                 # ROLLOUT_TEMP
  --clip-low 0.2 --clip-high 0.24 --dual-clip 10   # CLIP_LOW / CLIP_HIGH / clip_ratio_c
  --kl-coef 1e-3 --kl-clamp 5                   # KL_COEF, low_var_kl as the fork clamps it
  --loss-agg token-mean-per-micro-batch --mini-batches 2 --ppo-epochs 1   # UPDATE_BS 256 of 64 x 8 = 512 responses
  --lr 1e-6 --warmup-steps 0 --weight-decay 0.01 --grad-clip 1.0
  --epochs 5 --train-size 4500 --max-prompt-length 400   # EPOCH, merge_34567ppl's size, MAX_PROMPT
  --eval-every 20 --save-every 20               # save_freq / test_freq 20
  --micro-batch 8
  --output-dir runs/lopti_kk_ar
)
exec python train.py "${args[@]}" "$@"
