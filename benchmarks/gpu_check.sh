#!/usr/bin/env bash
# One prepared GPU check in parts, each one device call within its deadline (one CUDA GPU, an
# H200 sized it; offline). A session's 15 device minutes hold a start (1-2 min), part 1 (300 s) and
# part 2 (--deadline: status's budget_left_s less 60, at most 360 s), back to back; part 3 (560 s)
# and part 4 (430 s) a session each. Timings one at a time (nothing else on the GPU); a step whose
# estimate does not fit the time left is skipped and named, never cut mid-way. PLAN below: every
# step, its part, its estimate and what it is sized from (tests/test_benchmarks.py: each part's sum
# under its deadline, with margin). Output: at most 8 files under $OUT (runs/gpu_check):
#   part 1, issue 80's decision, first: the step on a random model of Qwen2.5-0.5B's shape, 16
#     prompts x M 8 x 256 tokens, bf16 autocast, micro-batch 64 (train.py's), each generate path in
#     a fresh process: the decode loop (train.py's --fast-generate; its two warm-up steps hold its
#     bf16 self-check, kept CUDA graphs against eager steps at the real rows, before and after an
#     optimizer step: its verdict lines), plain generate (the default), Hugging Face's static cache
#     with its compiled forward (benchmark only) -> step.txt: each path's ms and kernels a decode
#     token, decode and step against their floors; check.txt: versions, the card, its peaks
#   part 2, issue 63's targets: ours alone, then TRL's GRPOTrainer alone (from carried wheels),
#     each in a fresh process (a cold CUDA, its peak memory) -> step.txt, step.json (each phase
#     against its floor, ours / TRL); the step at Qwen2.5-1.5B's shape -> more.txt
#   part 3: a torch profile of ours at 64 new tokens (profile.txt), `python train.py` (the tiny
#     default) on CUDA -> check.txt; the 3B shape's step -> more.txt; the memory plan against the
#     measured peak, the 0.5B settings -> memory.txt
#   part 4: the same for the 1.5B and 3B settings -> memory.txt
#   summary.txt: the closing table (benchmarks/gpu_summary.py): the generate paths side by side
#     with the targets that decide the default, each check's verdict, each phase against its floor
# TRL's side needs trl 1.16.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19 as wheels in .whl/
# (torchao 0.18.0 for the 8-bit and NF4 memory settings, in its own path): `bash
# benchmarks/gpu_check.sh --fetch-wheels` on a machine with PyPI, then carry .whl; without them
# that side is skipped and said so.
# Usage: OUT=DIR [SKIP='NAME|NAME'] bash benchmarks/gpu_check.sh [--part 1|2|3|4] [--deadline S]
#          (default part 1, its PART_DEADLINES; SKIP: steps named as PLAN names them)
#        | --dry-run (every step of every part with tiny shapes on this CPU, minutes)
#        | --fetch-wheels | --help
set -uo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then sed -n '2,29p' "$0"; exit 0; fi
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
DRY=0 PART=1 DEADLINE=""
while (($#)); do
  case "$1" in
    --dry-run) DRY=1 ;;
    --part) PART=${2:-}; shift; [[ "$PART" =~ ^[1-4]$ ]] || { echo "gpu_check.sh: --part takes 1 to 4" >&2; exit 2; } ;;
    --deadline) DEADLINE=${2:-}; shift; [[ "$DEADLINE" =~ ^[0-9]+$ ]] || {
      echo "gpu_check.sh: --deadline takes whole seconds (status's budget_left_s less 60)" >&2; exit 2; } ;;
    *) echo "gpu_check.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
# Every step: part|estimate s|name|what the estimate is sized from. The logs: lab/logs/gpu-h200-27cee0c (one H200,
# transformers 5.17): a 0.5B-shaped step (16 x 8 x 256) 7.34 s (HF's cache) after a 21.6 s first
# step, decode 22.6 ms a token at 128 rows; 1.5B runs at 64 prompts and at memory_check's 16 x 8 x
# 256 did not finish in 60 s (weights drawn on the CPU: now on the GPU); 3B at the 24 GB plan's
# settings (1024-word prompts, 64 micro-batches) not in 230 s. A generate path's step: 2 or 3
# steps (warm-up and measured), then 8 and 24 tokens profiled.
PART_DEADLINES=(0 300 360 560 430)  # sessions: start (1-2 min) + part 1 + part 2 <= 15 min; + part 3; + part 4
PLAN=(
  "1|15|peaks|python + torch on CUDA ~8 s, a few 8192^3 matmuls and 1 GiB copies"
  "1|60|generate, loop|python, model ~10 s; first step, 2 eager checks ~25; 2 steps ~10 (inferred)"
  "1|50|generate, plain|python, model ~10 s, first step 21.6, a step 7.34 (27cee0c); profile ~5 s"
  "1|120|generate, hf-static|not measured: plain's ~45 s + inductor's compile (guessed 40-80 s)"
  "2|50|step, ours alone|python + model ~10 s + the first step 21.6 s + one steady step 8.23 s (27cee0c)"
  "2|70|step, trl alone|not measured yet (its crash at 27cee0c): trl + datasets import, HF generate as ours, 1.5x"
  "2|90|step, 1.5b|3.1x the 0.5B's FLOPs, 28 layers: ~25 s first, ~15 s steady step, python ~10 s, x 1.6 (unmeasured)"
  "3|60|profile|ours alone at 64 new tokens (~16 s first, ~2.5 s steady), ~0.2M events to fold (~20 s), python ~10 s"
  "3|75|tiny default|57 s at 27cee0c (a.txt: beside another lane's GPU work)"
  "3|110|step, 3b|6.2x the 0.5B's FLOPs, 36 layers, weights drawn on the GPU: ~35 s first, ~25 s steady, x 1.5"
  "3|35|memory qwen2.5-0.5b *|python ~10 s + a first 0.5B step at micro-batch 8 (~21.6 s at 27cee0c)"
  "4|60|memory qwen2.5-[13]*|a 1.5B or 3B first step (unmeasured: 27cee0c's drew weights on the CPU, over 60 s)"
  "4|0|memory plans|the dry run's: every setting's plan in one process, no GPU"
)
plan_of() {  # plan_of NAME -> "PART ESTIMATE" of its PLAN row (a name PLAN does not hold is a bug here: exit)
  local row part estimate pattern
  for row in "${PLAN[@]}"; do
    IFS='|' read -r part estimate pattern _ <<<"$row"
    # shellcheck disable=SC2053  # a PLAN name may be a glob
    if [[ "$1" == $pattern ]]; then echo "$part $estimate"; return; fi
  done
  echo "gpu_check.sh: step '$1' is not in PLAN" >&2; exit 3
}
in_part() {  # in_part N: whether this run runs part N (a dry run: every part)
  ((DRY || PART == $1))
}
OUT=${OUT:-runs/gpu_check}
DEADLINE=${DEADLINE:-${PART_DEADLINES[$PART]}}
((DEADLINE <= PART_DEADLINES[PART])) || { echo "gpu_check.sh: --deadline over part $PART's ${PART_DEADLINES[$PART]} s" >&2
  exit 2; }
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
step() {  # step FILE NAME COMMAND...: run if its PLAN estimate fits the time left, its output appended to FILE
  local file=$1 name=$2; shift 2
  local estimate left=$((DEADLINE - SECONDS)) skip
  estimate=$(plan_of "$name") || exit 3
  estimate=${estimate#* }
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
  DEVICE=cpu; SHAPE=test; MID=test; BIG=test; DTYPE=bf16; GIVEN=(--peak-tflops 0.05 --peak-gbps 5)  # (a probe
  STEPS=(--steps 1 --warmup 1 --prompts-per-step 2 -M 2 --max-new-tokens 4 --threads 1 "${GIVEN[@]}")  # per step
  TINY=(--steps 2 --eval-every 2 --eval-size 8 --prompts-per-step 4 --warm-start-steps 0)  # takes minutes here;
  SMALL=(--prompts 2 -M 2 --max-new-tokens 4 "${GIVEN[@]}")  # "peaks" runs it)
  PROFILE=()  # the steps' 4 tokens
else
  DEVICE=cuda; SHAPE=qwen2.5-0.5b; MID=qwen2.5-1.5b; BIG=qwen2.5-3b; DTYPE=bf16; STEPS=(--preset gpu --steps 1
    --warmup 1); TINY=(); SMALL=(--prompts 16); PROFILE=(--max-new-tokens 64)
fi
TRL_PATH=""
if in_part 2 && ls "$WHEELS"/trl-*.whl >/dev/null 2>&1; then  # TRL's side, a path of its own
  TRL_PATH=$(mktemp -d)/site-trl
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$TRL_PATH" \
    "$WHEELS"/trl-*.whl "$WHEELS"/datasets-*.whl "$WHEELS"/dill-*.whl "$WHEELS"/multiprocess-*.whl \
    >/dev/null 2>&1 || { echo "TRL wheels did not install"; TRL_PATH=""; }
fi
AO_PATH=""
if (in_part 3 || in_part 4) && ls "$WHEELS"/torchao-*.whl >/dev/null 2>&1; then
  AO_PATH=$(mktemp -d)/site-ao
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$AO_PATH" "$WHEELS"/torchao-*.whl \
    >/dev/null 2>&1 || AO_PATH=""
fi
TRL_NOTE="TRL: from $WHEELS"; [[ -n "$TRL_PATH" ]] || TRL_NOTE="TRL: no wheels in $WHEELS (--fetch-wheels), \
$("$PY" -c 'import trl; print("the environment'"'"'s trl", trl.__version__)' 2>/dev/null || echo "side skipped")"
{
  date -u; echo "python $PY | part $PART$( ((DRY)) && echo ' (dry run: every part)') | $TRL_NOTE"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
} >"$OUT/check.txt" 2>&1
# ---- part 1: issue 80's decision, the generate paths on the same shapes --------------------------
if in_part 1; then
  step check.txt "peaks" "$PY" -c "from benchmarks import floor; import torch; d = '$DEVICE'
name = floor.known_gpu(torch.cuda.get_device_name()) if d == 'cuda' else None; dtype = 'bf16' if d == 'cuda' else 'fp32'
p = floor.probe(d, dtype); print(f'probe: {p.flops / 1e12:.1f} TFLOP/s {dtype}, {p.bandwidth / 1e9:.0f} GB/s copy;',
'datasheet:', floor.KNOWN_GPUS.get(name, 'not in floor.KNOWN_GPUS'))"
  # each path in a fresh process at ours alone's micro-batch, 64 (train.py's default); the loop's
  # two warm-up steps hold its self-check (its first two CUDA rollout calls: kept graphs against
  # eager steps, bf16, 128 rows): the one measured step is the loop alone
  for path in loop plain hf-static; do
    warmup=1; [[ $path == loop ]] && warmup=2
    step step.txt "generate, $path" "$PY" benchmarks/random_model_step.py --shape "$SHAPE" \
      --device "$DEVICE" --dtype "$DTYPE" "${SMALL[@]}" --micro-batch 64 --generate "$path" \
      --warmup "$warmup" --steps 1 --per-token
  done
fi
# ---- part 2: issue 63's targets (ours and TRL, each alone), the 1.5B shape -----------------------
if in_part 2; then
  # ours, then TRL, each alone in a fresh process: its first step on a cold CUDA, its steady step, its peak memory
  step step.txt "step, ours alone" "$PY" benchmarks/step_time.py --random-shape "$SHAPE" --device "$DEVICE" \
    --dtype "$DTYPE" "${STEPS[@]}" --only ours --json "$OUT/step.json"
  if [[ -n "$TRL_PATH" ]] || "$PY" -c "import trl" 2>/dev/null; then
    step step.txt "step, trl alone" env ${TRL_PATH:+PYTHONPATH=$TRL_PATH} "$PY" benchmarks/step_time.py \
      --random-shape "$SHAPE" --device "$DEVICE" --dtype "$DTYPE" "${STEPS[@]}" --only trl
  else
    echo "=== step, trl alone: not run (no TRL: --fetch-wheels)" >>"$OUT/step.txt"
  fi
  step more.txt "step, 1.5b" "$PY" benchmarks/random_model_step.py --shape "$MID" --device "$DEVICE" --steps 1 \
    "${SMALL[@]}" --micro-batch 8
fi
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
  "qwen2.5-3b|--param-dtype bf16-sr --optimizer adamw8bit --step-in-backward --gradient-checkpointing --micro-batch 128"
)
MEMORY_SHAPE_FLAGS="--prompts 16 -M 8 --prompt-digits 0 --max-new-tokens 256 --micro-batch 8"
# ---- parts 3 and 4: the profile, the tiny default, the 3B shape, the memory plan against the peak
if in_part 3; then  # the profile at 64 new tokens: ~0.2M events for key_averages to fold, not 256 tokens' ~0.8M
  step profile.txt "profile" "$PY" benchmarks/step_time.py --random-shape "$SHAPE" --device "$DEVICE" \
    --dtype "$DTYPE" "${STEPS[@]}" --profile torch "${PROFILE[@]}"
  step check.txt "tiny default" "$PY" train.py --device "$DEVICE" --output-dir "$OUT/tiny-run" "${TINY[@]}"
  rm -rf "$OUT/tiny-run"  # its metrics are in check.txt; the 8-file budget
  step more.txt "step, 3b" "$PY" benchmarks/random_model_step.py --shape "$BIG" --device "$DEVICE" --steps 1 \
    "${SMALL[@]}" --micro-batch 8
fi
if in_part 3 || in_part 4; then  # each setting in the part PLAN gives it
  if ((DRY)); then  # every setting's plan in one process (each a fresh process on the GPU, for its own peak)
    step memory.txt "memory plans" "$PY" -c "import shlex, sys; from benchmarks import memory_check
for setting in sys.argv[1:]:
    shape, flags = setting.split('|'); memory_check.main(['--model', shape, '--device', 'cuda', '--plan-only',
        *shlex.split('$MEMORY_SHAPE_FLAGS'), *shlex.split(flags), '--setting=' + (flags or 'as written')])" \
      "${MEMORY_SETTINGS[@]}"
  else
    for setting in "${MEMORY_SETTINGS[@]}"; do
      shape=${setting%%|*} flags=${setting#*|}
      part=$(plan_of "memory $shape ${flags:-(as written)}") || exit 3
      in_part "${part%% *}" || continue
      path=""; [[ "$flags" == *adamw8bit* || "$flags" == *nf4* ]] && path=$AO_PATH
      if [[ ("$flags" == *adamw8bit* || "$flags" == *nf4*) && -z "$path" ]] && ! "$PY" -c "import torchao" 2>/dev/null
      then
        echo "MEMORY $shape $flags: skipped (no torchao: --fetch-wheels)" >>"$OUT/memory.txt"; continue
      fi
      step memory.txt "memory $shape ${flags:-(as written)}" env ${path:+PYTHONPATH=$path} "$PY" \
        benchmarks/memory_check.py --model "$shape" --device "$DEVICE" $MEMORY_SHAPE_FLAGS $flags \
        --setting="${flags:-as written}"
    done
  fi
fi
# ---- the closing table ---------------------------------------------------------------------------------------------
printf '%s\n' "${SKIPPED[@]}" >"$OUT/skipped.tmp"
SHOWN_DEADLINE=$DEADLINE; ((DRY)) && SHOWN_DEADLINE=0  # a dry run has none
"$PY" benchmarks/gpu_summary.py "$OUT" --seconds "$SECONDS" --deadline "$SHOWN_DEADLINE" --skipped "$OUT/skipped.tmp" \
  | tee "$OUT/summary.txt"
rm -f "$OUT/skipped.tmp"
