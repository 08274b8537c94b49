#!/usr/bin/env bash
# One prepared GPU check: one H200 (or any CUDA GPU), no network, under 8 minutes. Prints and saves under $OUT:
#   0. first, the fast paths' self-check (benchmarks/self_check.py): the roomy cache and compiled generate against
#      plain generate, greedy, bf16, on the tiny shape and Qwen2.5-0.5B's (what every CUDA run checks at its start);
#   1. the GPU, torch and transformers versions, and its peaks probed (bf16 matmul, copy) next to the datasheet's;
#   2. `python train.py` (the tiny offline default) on CUDA to completion: its before/after table and wall time;
#   3. a randomly initialised model with Qwen2.5-0.5B's shape (built from a config, no download), bf16:
#      64 prompts x M=8 x 256 tokens, one pass, with --fast-generate (static KV cache + CUDA graphs; its compile
#      time), with HF's concatenating DynamicCache (what the default roomy_cache saves) and AR + Lopti: s/step,
#      completion tokens/s, peak GPU memory, each phase against its floor;
#   4. the same shape at 1.5B, one pass (the SoftmaxGRPO Countdown recipe's model size), against its floor;
#   5. the datasheet floor of both shapes (benchmarks/floor.py) for the record;
#   6. while the 8 minutes last: both shapes' peak memory (torch.cuda.max_memory_allocated) next to the plan, with
#      and without --gradient-checkpointing, then issue 41's options: bf16 storage with the optimizer's states in
#      CPU memory (--optimizer-offload), LoRA on a 4-bit NF4 base (--base-dtype nf4), 8-bit moments (adamw8bit).
# Usage: bash benchmarks/gpu_check.sh            OUT=runs/gpu_check by default; bash benchmarks/gpu_check.sh --help
#        bash benchmarks/gpu_check.sh --dry-run  the memory settings of step 6 and their plans only (any machine)
set -uo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then sed -n '2,17p' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
# Step 6's settings, in the order they run (the budget may cut the last): shape, then memory_check.py's flags.
MEMORY_SETTINGS=(
  "qwen2.5-0.5b|"
  "qwen2.5-0.5b|--gradient-checkpointing"
  "qwen2.5-0.5b|--param-dtype bf16 --optimizer-offload"
  "qwen2.5-0.5b|--param-dtype bf16 --lora-rank 16 --kl-coef 0.01 --base-dtype nf4"
  "qwen2.5-1.5b|--param-dtype bf16 --optimizer-offload"
  "qwen2.5-1.5b|--param-dtype bf16 --lora-rank 16 --kl-coef 0.01 --base-dtype nf4"
  "qwen2.5-0.5b|--param-dtype bf16-sr --step-in-backward --micro-batch 128"  # issue 52: no masters, one micro-batch
  "qwen2.5-1.5b|--param-dtype bf16-sr --optimizer adamw8bit --step-in-backward --gradient-checkpointing --micro-batch 128"
  "qwen2.5-0.5b|--param-dtype bf16 --optimizer adamw8bit"  # torch.compile's first step: ~1 min
  "qwen2.5-1.5b|"
  "qwen2.5-1.5b|--gradient-checkpointing"
)
MEMORY_SHAPE_FLAGS="--prompts 16 -M 8 --prompt-digits 0 --max-new-tokens 256 --micro-batch 8"
if [[ "${1:-}" == "--dry-run" ]]; then  # the plans alone: no GPU, no model built
  for setting in "${MEMORY_SETTINGS[@]}"; do
    python benchmarks/memory_check.py --plan-only --model "${setting%%|*}" --device cuda $MEMORY_SHAPE_FLAGS \
      ${setting#*|} --setting="${setting#*|}" 2>&1 | grep -E "^PLAN|rror" || echo "PLAN ${setting}: failed"
  done
  exit 0
fi
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep its output; a failure does not stop the rest
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" 2>&1 | grep -v "it/s" | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  [[ $rc -eq 0 ]] || echo "$name: exit $rc (124: over its $limit s)" | tee -a "$OUT/$name.txt"
}
step self_check 100 python benchmarks/self_check.py --device cuda --shape qwen2.5-0.5b  # the verdict, first
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
  python -c "from benchmarks import floor; import torch; name = floor.known_gpu(torch.cuda.get_device_name());
p = floor.probe('cuda', 'bf16'); print(f'probe: {p.flops / 1e12:.0f} TFLOP/s bf16, {p.bandwidth / 1e9:.0f} GB/s copy;',
'datasheet:', floor.KNOWN_GPUS.get(name, 'not in floor.KNOWN_GPUS'))"
} 2>&1 | tee "$OUT/gpu.txt"
start=$SECONDS
step tiny 90 python train.py --device cuda --output-dir "$OUT/tiny"
echo "tiny default on CUDA: $((SECONDS - start)) s wall" | tee -a "$OUT/tiny.txt"
step qwen2.5-0.5b 75 python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda --steps 3
step qwen2.5-0.5b-fast 130 python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda --steps 3 \
  --fast-generate
step qwen2.5-0.5b-concat 45 python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda --steps 1 \
  --concatenated-cache  # HF's DynamicCache as it is: what roomy_cache (the default) saves
step qwen2.5-0.5b-lopti 60 python benchmarks/random_model_step.py --shape qwen2.5-0.5b --device cuda --steps 2 --lopti
step qwen2.5-1.5b 80 python benchmarks/random_model_step.py --shape qwen2.5-1.5b --device cuda --steps 2 --micro-batch 8
for shape in qwen2.5-0.5b qwen2.5-1.5b; do
  python benchmarks/floor.py --shape "$shape" --device cuda --dtype bf16 2>&1 | tee "$OUT/floor-$shape.txt"
done
# ---- memory plan vs measured (issue 28; benchmarks/memory_check.py) ------------------------------------------------
# The peak GPU memory of one RL step (rollout and update phases, after a warm-up step) of random models with Qwen2.5
# 0.5B and 1.5B shapes, with and without --gradient-checkpointing, printed next to harness/memory.py's plan.
for setting in "${MEMORY_SETTINGS[@]}"; do
  shape=${setting%%|*} flags=${setting#*|}
  left=$((470 - SECONDS))  # what the 8-minute budget leaves: the memory runs come last and fit into it
  if (( left < 30 )); then
    echo "MEMORY $shape $flags: skipped (the 8-minute budget is spent)" | tee -a "$OUT/memory.txt"
    continue
  fi
  timeout $((left < 100 ? left : 100)) python benchmarks/memory_check.py --model "$shape" --device cuda \
    $MEMORY_SHAPE_FLAGS $flags 2>&1 | tee -a "$OUT/memory-raw.txt" | grep RESULT \
    | python -c "import json, sys; r = json.loads(sys.stdin.read()[7:]); p, m = r['plan'], r['measured']; \
print(f\"MEMORY {r['model']} ${flags:-(as written)}: planned {p['peak'] / 2**30:.2f} GiB \
(rollout {p['rollout_peak'] / 2**30:.2f}, update {p['update_peak'] / 2**30:.2f}), measured {m['peak'] / 2**30:.2f} \
GiB (rollout {m['rollout_peak'] / 2**30:.2f}, update {m['update_peak'] / 2**30:.2f}), s/step \
{sum(r['seconds'].values()):.1f}\")" | tee -a "$OUT/memory.txt" \
    || echo "MEMORY $shape $flags: failed" | tee -a "$OUT/memory.txt"
done
# ---- end of the memory block ---------------------------------------------------------------------------------------
grep -h "RESULT\|after RL\|before RL\|wall\|compilation\|^step \|exit\|self-check\|match\|DIFFER" "$OUT"/*.txt
echo "total: $((SECONDS - start)) s"
