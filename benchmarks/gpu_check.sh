#!/usr/bin/env bash
# One prepared GPU check: one H200 (or any CUDA GPU), no network, under 8 minutes. Prints and saves under $OUT:
#   1. the GPU, torch and transformers versions;
#   2. `python train.py` (the tiny offline default) on CUDA to completion: its before/after table and wall time;
#   3. a randomly initialised model with Qwen2.5-0.5B's shape (built from a config, no download), bf16:
#      64 prompts x M=8 x 256 tokens, one pass and AR + Lopti: s/step, completion tokens/s, peak GPU memory;
#   4. the same shape at 1.5B, one pass (the SoftmaxGRPO Countdown recipe's model size).
# Usage: bash benchmarks/gpu_check.sh            OUT=runs/gpu_check by default; bash benchmarks/gpu_check.sh --help
set -euo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then sed -n '2,8p' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
start=$SECONDS
timeout 200 python train.py --device cuda --output-dir "$OUT/tiny" 2>&1 | grep -v "it/s" | tail -8 | tee "$OUT/tiny.txt"
echo "tiny default on CUDA: $((SECONDS - start)) s wall" | tee -a "$OUT/tiny.txt"
timeout 150 python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda --steps 3 2>&1 \
  | tee "$OUT/qwen2.5-0.5b.txt"
timeout 90 python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda --steps 2 --lopti 2>&1 \
  | tee "$OUT/qwen2.5-0.5b-lopti.txt"
timeout 120 python benchmarks/random_model_step.py --shape qwen2.5-1.5b --device cuda --steps 2 --micro-batch 8 2>&1 \
  | tee "$OUT/qwen2.5-1.5b.txt"
grep -h "RESULT\|after RL\|before RL\|wall" "$OUT"/*.txt

# ---- memory plan vs measured (issue 28; benchmarks/memory_check.py) ------------------------------------------------
# The peak GPU memory of one RL step (rollout and update phases, after a warm-up step) of random models with Qwen2.5
# 0.5B and 1.5B shapes, with and without --gradient-checkpointing, printed next to harness/memory.py's plan.
for shape in qwen2.5-0.5b qwen2.5-1.5b; do
  for ckpt in "" --gradient-checkpointing; do
    timeout 150 python benchmarks/memory_check.py --model "$shape" --device cuda --prompts 16 -M 8 \
      --prompt-digits 0 --max-new-tokens 256 --micro-batch 8 $ckpt 2>&1 | grep RESULT \
      | python -c "import json, sys; r = json.loads(sys.stdin.read()[7:]); p, m = r['plan'], r['measured']; \
print(f\"MEMORY {r['model']} ${ckpt:-(no checkpointing)}: planned {p['peak'] / 2**30:.2f} GiB \
(rollout {p['rollout_peak'] / 2**30:.2f}, update {p['update_peak'] / 2**30:.2f}), measured {m['peak'] / 2**30:.2f} \
GiB (rollout {m['rollout_peak'] / 2**30:.2f}, update {m['update_peak'] / 2**30:.2f}), s/step \
{sum(r['seconds'].values()):.1f}\")" | tee -a "$OUT/memory.txt" \
      || echo "MEMORY $shape $ckpt: failed" | tee -a "$OUT/memory.txt"
  done
done
# ---- end of the memory block ---------------------------------------------------------------------------------------
