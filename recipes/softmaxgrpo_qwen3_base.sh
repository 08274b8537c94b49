#!/usr/bin/env bash
# SoftmaxGRPO on Polaris math with Qwen3-1.7B-Base: jeffhernandez1995/softmaxgrpo, softmaxgrpo/configs/qwen3.yaml
# = qwen3_base.yaml (over base.yaml): tau 0.3 (l.7), 256 prompts x 16 rollouts (l.13, l.25), 4096 response tokens
# (l.15), Qwen/Qwen3-1.7B-Base (l.19), clip_ratio_high 0.2 (l.21), grad_clip 0.3 (l.22), no KL loss (l.23),
# top_p 1.0 (l.29), 5 epochs (l.38-39), test_freq / save_freq 50 (l.40-41); the rest from base.yaml (clip_ratio_low
# 0.2, lr 1e-6, ppo_micro_batch_size_per_gpu 4, temperature 1.0). The official trainer reads
# POLARIS-Project/Polaris-Dataset-53K (prepare_data.py --task qwen3) with an exact math-verify reward: our deepmath
# task with its math_verify rules. Rows with question / final_answer (rename Polaris' problem / answer):
#   POLARIS_DATA=data/polaris.parquet bash recipes/softmaxgrpo_qwen3_base.sh     # (--dry-run: print and exit)
# 5 epochs over the file (--epochs 5: 5 x floor(rows / 256) steps, verl dropping the last partial batch; about 1040
# for Polaris' 53 291 rows, after prepare_data removes AIME25 / MATH-500 prompts). Not expressible here, so not
# copied: the epochs' shuffle seed (data.seed 79), the user-only prompt
# (problem + "Please reason step by step ... \boxed{}."; ours, answer_style=boxed: the same user turn after the
# official system line of the other configs), validation on AIME25 and MATH-500 with 32 samples at temperature
# 0.6 / top_p 0.95 (ours: greedy on held-out rows), 4 nodes with vLLM.
# Memory (its plan: --dry-run --device cuda): peak 178.3 GB as written; fits 80 GB with --micro-batch 2 --rollout-batch 64; 24 GB with --gradient-checkpointing --micro-batch 2 --optimizer-offload --param-dtype bf16 --rollout-batch 16
set -euo pipefail
cd "$(dirname "$0")/.."
args=(
  --model Qwen/Qwen3-1.7B-Base                  # actor_rollout_ref.model.path
  --task deepmath --data "${POLARIS_DATA:-data/polaris}"   # Polaris rows, math_correct (math-verify)
  --task-option answer_style=boxed              # the official \boxed{} math prompt (prepare_data.py)
  --method softmax --tau 0.3                    # algorithm.softmaxgrpo_tau
  --num-generations 16 --prompts-per-step 256   # rollout.n, data.train_batch_size
  --max-new-tokens 4096                         # data.max_response_length
  --temperature 1.0 --top-p 1.0                 # rollout.temperature (base) / top_p
  --clip-low 0.2 --clip-high 0.2                # clip_ratio_low (base) / high; clip_ratio_c 1e9 = no dual clip
  --kl-coef 0                                   # use_kl_loss: false (no reference model)
  --loss-agg token-mean-per-micro-batch --mini-batches 1 --ppo-epochs 1   # ppo_mini_batch_size = train_batch_size
  --lr 1e-6 --warmup-steps 0 --weight-decay 0.01 --grad-clip 0.3   # verl's AdamW defaults, actor.grad_clip
  --epochs 5 --eval-every 50 --save-every 50    # total_epochs (no step cap), test_freq, save_freq
  --max-prompt-length 1024                      # max_prompt_length, filter_overlong_prompts (base.yaml)
  --micro-batch 4 --rollout-batch 256           # ppo_micro_batch_size_per_gpu; rows per generate call (memory)
  --output-dir runs/softmaxgrpo_qwen3_base
)
exec python train.py "${args[@]}" "$@"
