#!/usr/bin/env bash
# One prepared GPU check: one CUDA GPU (an H200 sized it), no network, within a global deadline (DEADLINE, 420 s).
# Correctness first, then timings one at a time (nothing else on the GPU meanwhile); a step whose estimate does not
# fit the time left is skipped and named, never cut mid-way. Output: at most 8 files under $OUT (runs/gpu_check):
#   check.txt    versions, the card and its probed peaks; every fast path's self-check against plain generate
#                (the default cache, no shared prefill, static cache + compiled decode: tiny shape and Qwen2.5-0.5B's, under
#                bf16 autocast); `python train.py` (the tiny offline default) on CUDA: its before/after table, wall
#   step.txt     benchmarks/step_time.py --preset gpu: a random model of Qwen2.5-0.5B's shape, 16 prompts x M 8 x
#                256 tokens, ours (one pass; AR + Lopti) against TRL's GRPOTrainer (from carried wheels), each phase
#                against its floor; step.json: its numbers; then each side's peak memory in a fresh process
#   profile.txt  a torch profile of our step's top CUDA kernels (the same workload)
#   more.txt     the 0.5B step with --fast-generate (static cache, CUDA graphs) and with the roomy cache (a CPU's
#                default) instead of HF's concatenating one (CUDA's); the step at Qwen2.5-1.5B's shape
#   memory.txt   the memory plan against the measured peak, per setting, while time is left
#   summary.txt  the closing table: each check's verdict, each phase against its floor, the targets' ratios
# TRL's side needs trl 1.16.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19 as wheels in .whl/ (torchao 0.18.0
# for the 8-bit and NF4 memory settings, in its own path): `bash benchmarks/gpu_check.sh --fetch-wheels` on a machine
# with PyPI, then carry .whl; without them that side is skipped and said so.
# Usage: OUT=DIR DEADLINE=SECONDS SKIP='NAME|NAME' bash benchmarks/gpu_check.sh   (SKIP: steps named so, as the
#          output names them, e.g. a second run's SKIP='self-check|tiny default|step, qwen2.5-0.5b')
#        | --dry-run (every step with tiny shapes on this CPU, < 3 min unloaded)
#        | --fetch-wheels | --help
set -uo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then sed -n '2,22p' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
WHEELS=.whl
if [[ "${1:-}" == "--fetch-wheels" ]]; then  # the H200's Python is 3.12 (docs: the device's README)
  mkdir -p "$WHEELS"; grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude
  for wheel in trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 torchao==0.18.0; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d "$WHEELS" "$wheel" || echo "could not fetch $wheel"
  done
  ls "$WHEELS"; exit 0
fi
DRY=0; [[ "${1:-}" == "--dry-run" ]] && DRY=1
OUT=${OUT:-runs/gpu_check}
DEADLINE=${DEADLINE:-420}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore
PY=""  # a python that holds torch: on the H200 python3 is a virtual environment's, and `python` may be another
for candidate in python3 python; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
    PY=$(command -v "$candidate"); break
  fi
done
[[ -n "$PY" ]] || { echo "no python with torch on PATH" | tee "$OUT/summary.txt"; exit 1; }
SKIPPED=()
step() {  # step FILE ESTIMATE_S NAME COMMAND...: run if its estimate fits the time left, its output appended to FILE
  local file=$1 estimate=$2 name=$3; shift 3
  local left=$((DEADLINE - SECONDS)) skip
  IFS='|' read -ra skip <<<"${SKIP:-}"
  for pattern in "${skip[@]}"; do
    if [[ "$name" == "$pattern" ]]; then
      SKIPPED+=("$name (SKIP)"); echo "=== $name: skipped (SKIP=$SKIP)" | tee -a "$OUT/$file"; return
    fi
  done
  if ((DRY == 0 && estimate > left)); then
    SKIPPED+=("$name (~${estimate} s, ${left} s left)")
    echo "=== $name: skipped (estimate ~${estimate} s, ${left} s left)" | tee -a "$OUT/$file"
    return
  fi
  echo "=== [${SECONDS} s] $name: $*" >>"$OUT/$file"
  local start=$SECONDS
  ((DRY)) && left=600  # a dry run walks every step, whatever the clock says
  timeout "$((left > 10 ? left : 10))" "$@" 2>&1 | grep -v -E "it/s\]|s/it\]|^W[0-9]{4} |Failed to load" \
    >>"$OUT/$file"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - start)) s (estimate ${estimate} s)" | tee -a "$OUT/$file"
}
if ((DRY)); then  # the same steps on this CPU with tiny shapes: what a GPU run will do, tested before it is spent
  DEVICE=cpu; SHAPE=test; BIG=test; DTYPE=bf16; STEPS=(--steps 1 --warmup 1 --prompts-per-step 2 -M 2
    --max-new-tokens 4 --threads 1); TINY=(--steps 2 --eval-every 2 --eval-size 8 --prompts-per-step 4
    --warm-start-steps 0); CHECK=(--shape test --threads 1)
else
  DEVICE=cuda; SHAPE=qwen2.5-0.5b; BIG=qwen2.5-1.5b; DTYPE=bf16; STEPS=(--preset gpu); TINY=(); CHECK=(--shape
    "$SHAPE")
fi
TRL_PATH=""
if ls "$WHEELS"/trl-*.whl >/dev/null 2>&1; then  # TRL's side from carried wheels, on a path of its own
  TRL_PATH=$(mktemp -d)/site-trl
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$TRL_PATH" \
    "$WHEELS"/trl-*.whl "$WHEELS"/datasets-*.whl "$WHEELS"/dill-*.whl "$WHEELS"/multiprocess-*.whl \
    >/dev/null 2>&1 || { echo "TRL wheels did not install"; TRL_PATH=""; }
fi
AO_PATH=""
if ls "$WHEELS"/torchao-*.whl >/dev/null 2>&1; then
  AO_PATH=$(mktemp -d)/site-ao
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$AO_PATH" "$WHEELS"/torchao-*.whl \
    >/dev/null 2>&1 || AO_PATH=""
fi
TRL_NOTE="TRL: from $WHEELS"; [[ -n "$TRL_PATH" ]] || TRL_NOTE="TRL: no wheels in $WHEELS (--fetch-wheels), \
$("$PY" -c 'import trl; print("the environment'"'"'s trl", trl.__version__)' 2>/dev/null || echo "side skipped")"
# ---- 1. correctness: versions and peaks, every fast path's self-check, the tiny default to completion -------------
{
  date -u; echo "python $PY | $TRL_NOTE"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
} >"$OUT/check.txt" 2>&1
step check.txt 20 "peaks" "$PY" -c "from benchmarks import floor; import torch; d = '$DEVICE'
name = floor.known_gpu(torch.cuda.get_device_name()) if d == 'cuda' else None; dtype = 'bf16' if d == 'cuda' else 'fp32'
p = floor.probe(d, dtype); print(f'probe: {p.flops / 1e12:.1f} TFLOP/s {dtype}, {p.bandwidth / 1e9:.0f} GB/s copy;',
'datasheet:', floor.KNOWN_GPUS.get(name, 'not in floor.KNOWN_GPUS'))"
step check.txt 120 "self-check" "$PY" benchmarks/self_check.py --device "$DEVICE" --dtype "$DTYPE" "${CHECK[@]}"
step check.txt 75 "tiny default" "$PY" train.py --device "$DEVICE" --output-dir "$OUT/tiny-run" "${TINY[@]}"
rm -rf "$OUT/tiny-run"  # its metrics are in check.txt; the 8-file budget
# ---- 2. timings, one at a time -------------------------------------------------------------------------------------
# Sized from the first H200 run (27cee0c): a 0.5B-shaped step ~8 s after a ~21 s first step, python and a model ~15 s
step step.txt 135 "step, $SHAPE" env ${TRL_PATH:+PYTHONPATH=$TRL_PATH} "$PY" benchmarks/step_time.py \
  --random-shape "$SHAPE" --device "$DEVICE" --dtype "$DTYPE" "${STEPS[@]}" --no-memory --json "$OUT/step.json"
SMALL=""; ((DRY)) && SMALL="--prompts 2 -M 2 --max-new-tokens 4"
if ((DRY)); then  # inductor on a CPU takes minutes: tests/test_fast_generate.py's slow tests compile there
  echo "=== step, $SHAPE, --fast-generate: not in a dry run (compiles on CUDA; on a CPU the slow tests)" >>"$OUT/more.txt"
else
  step more.txt 90 "step, $SHAPE, --fast-generate" "$PY" benchmarks/random_model_step.py --shape "$SHAPE" \
    --device "$DEVICE" --steps 1 --prompts 16 --fast-generate  # static cache + CUDA graphs, with its compile time
fi
for side in ours trl; do  # each side's peak in a fresh process (a process's peak only grows), as step_time does
  [[ $side == trl && -z "$TRL_PATH" ]] && ! "$PY" -c "import trl" 2>/dev/null && continue
  step step.txt 50 "memory, $side alone" env ${TRL_PATH:+PYTHONPATH=$TRL_PATH} "$PY" benchmarks/step_time.py \
    --random-shape "$SHAPE" --device "$DEVICE" --dtype "$DTYPE" "${STEPS[@]}" --only "$side" --no-memory --steps 1 \
    --warmup 1
done
step profile.txt 45 "profile, $SHAPE" "$PY" benchmarks/step_time.py --random-shape "$SHAPE" --device "$DEVICE" \
  --dtype "$DTYPE" "${STEPS[@]}" --profile torch
step more.txt 45 "step, $SHAPE, roomy cache" "$PY" benchmarks/random_model_step.py --shape "$SHAPE" \
  --device "$DEVICE" --steps 1 --prompts 16 --roomy-cache $SMALL  # CUDA's default is HF's concatenating cache
step more.txt 60 "step, $BIG" "$PY" benchmarks/random_model_step.py --shape "$BIG" --device "$DEVICE" --steps 1 \
  --prompts 16 --micro-batch 8 $SMALL
# ---- 3. the memory plan against the measured peak, while time is left ----------------------------------------------
MEMORY_SETTINGS=(  # shape | memory_check.py's flags, in the order they run
  "qwen2.5-0.5b|"
  "qwen2.5-0.5b|--gradient-checkpointing"
  "qwen2.5-0.5b|--param-dtype bf16 --optimizer-offload"
  "qwen2.5-0.5b|--param-dtype bf16-sr --step-in-backward --micro-batch 128"  # no masters, one micro-batch
  "qwen2.5-0.5b|--param-dtype bf16 --lora-rank 16 --kl-coef 0.01 --base-dtype nf4"
  "qwen2.5-0.5b|--param-dtype bf16 --optimizer adamw8bit"
  "qwen2.5-1.5b|"
  "qwen2.5-1.5b|--gradient-checkpointing"
  "qwen2.5-1.5b|--param-dtype bf16 --optimizer-offload"
  "qwen2.5-1.5b|--param-dtype bf16 --lora-rank 16 --kl-coef 0.01 --base-dtype nf4"
  "qwen2.5-1.5b|--param-dtype bf16-sr --optimizer adamw8bit --step-in-backward --gradient-checkpointing --micro-batch 128"
)
MEMORY_SHAPE_FLAGS="--prompts 16 -M 8 --prompt-digits 0 --max-new-tokens 256 --micro-batch 8"
if ((DRY)); then  # every setting's plan in one process (each a fresh process on the GPU, for its own peak)
  step memory.txt 30 "memory plans" "$PY" -c "import shlex, sys; from benchmarks import memory_check
for setting in sys.argv[1:]:
    shape, flags = setting.split('|'); memory_check.main(['--model', shape, '--device', 'cuda', '--plan-only',
        *shlex.split('$MEMORY_SHAPE_FLAGS'), *shlex.split(flags), '--setting=' + (flags or 'as written')])" \
    "${MEMORY_SETTINGS[@]}"
else
  for setting in "${MEMORY_SETTINGS[@]}"; do
    shape=${setting%%|*} flags=${setting#*|}
    estimate=35; [[ $shape == qwen2.5-1.5b ]] && estimate=60
    path=""; [[ "$flags" == *adamw8bit* || "$flags" == *nf4* ]] && path=$AO_PATH
    if [[ ("$flags" == *adamw8bit* || "$flags" == *nf4*) && -z "$path" ]] && ! "$PY" -c "import torchao" 2>/dev/null
    then
      echo "MEMORY $shape $flags: skipped (no torchao: --fetch-wheels)" >>"$OUT/memory.txt"; continue
    fi
    step memory.txt "$estimate" "memory $shape ${flags:-(as written)}" env ${path:+PYTHONPATH=$path} "$PY" \
      benchmarks/memory_check.py --model "$shape" --device "$DEVICE" $MEMORY_SHAPE_FLAGS $flags \
      --setting="${flags:-as written}"
  done
fi
# ---- the closing table ---------------------------------------------------------------------------------------------
printf '%s\n' "${SKIPPED[@]}" >"$OUT/skipped.tmp"
"$PY" benchmarks/gpu_summary.py "$OUT" --seconds "$SECONDS" --deadline "$DEADLINE" --skipped "$OUT/skipped.tmp" \
  | tee "$OUT/summary.txt"
rm -f "$OUT/skipped.tmp"
