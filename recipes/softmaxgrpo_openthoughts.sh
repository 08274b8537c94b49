#!/usr/bin/env bash
# SoftmaxGRPO with the similarity reward on OpenThoughts: jeffhernandez1995/softmaxgrpo,
# softmaxgrpo/configs/openthoughts.yaml (over base.yaml): tau 0.3 (l.7), 512 prompts x 8 rollouts (l.11, l.18),
# 6144 response tokens (l.13), ppo_micro_batch_size_per_gpu 4 (l.16), 3220 steps (l.20); the rest from base.yaml
# (Qwen/Qwen2.5-1.5B, clip 0.2 / 0.28, k3 KL 1e-3, lr 1e-6, top_p 0.999). Reward (rewards.py compute_score, task
# "openthoughts"): 0.65 * similarity + 0.35 * format, our text_match rules=openthoughts (its prompt too).
# Data: open-thoughts/OpenThoughts3-1.2M as rows {"prompt": the user turn, "reference": the assistant turn}
# (JSONL or parquet; the reward compares the reference's text after </think>):
#   OPENTHOUGHTS_DATA=data/openthoughts.parquet bash recipes/softmaxgrpo_openthoughts.sh   # (--dry-run: print)
# Not expressible here, so not copied: max_prompt_length 2048 (longer prompts are not filtered out), the held-out
# split (official: at most 10% / 500 distinct prompts, hash-ranked; ours: 1 row in 10 by a hash of the prompt),
# 2 nodes with vLLM.
# Memory (its plan: --dry-run --device cuda): peak 128.2 GB as written; fits 80 GB with --micro-batch 1 --rollout-batch 128; 24 GB with --gradient-checkpointing --micro-batch 2 --optimizer-offload --param-dtype bf16 --rollout-batch 32
set -euo pipefail
cd "$(dirname "$0")/.."
args=(
  --model Qwen/Qwen2.5-1.5B                     # actor_rollout_ref.model.path (base.yaml)
  --task text_match --data "${OPENTHOUGHTS_DATA:-data/openthoughts}"
  --task-option rules=openthoughts --task-option format_weight=0.35   # 0.35 * format + 0.65 * similarity
  --method softmax --tau 0.3                    # algorithm.softmaxgrpo_tau
  --num-generations 8 --prompts-per-step 512    # rollout.n, data.train_batch_size
  --max-new-tokens 6144                         # data.max_response_length
  --temperature 1.0 --top-p 0.999               # rollout.temperature / top_p (top_k off)
  --clip-low 0.2 --clip-high 0.28               # clip_ratio_low / high; clip_ratio_c 1e9 = no dual clip
  --kl-coef 1e-3 --kl-clamp 20                  # kl_loss_coef, low_var_kl (verl clamps the log-ratio to +-20)
  --loss-agg token-mean-per-micro-batch --mini-batches 1 --ppo-epochs 1   # ppo_mini_batch_size = train_batch_size
  --lr 1e-6 --warmup-steps 0 --weight-decay 0.01 --grad-clip 1.0   # verl's AdamW defaults
  --steps 3220 --eval-every 25 --save-every 100 # total_training_steps, test_freq, save_freq
  --max-prompt-length 2048                      # max_prompt_length, filter_overlong_prompts
  --micro-batch 4 --rollout-batch 256           # ppo_micro_batch_size_per_gpu; rows per generate call (memory)
  --output-dir runs/softmaxgrpo_openthoughts
)
exec python train.py "${args[@]}" "$@"
