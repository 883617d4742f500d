#!/usr/bin/env bash
# Session 20, call 7: FlashMLA built; v74 (= src, the package) beside FlashMLA in one process, clean L2: 128 heads
# batched bf16 q1/q2 and the 16-head ragged batch. Rows print as they finish.
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s); deadline=$(( t0 + ${BUDGET_S:-420} ))
if ! PYTHONPATH=build/flashmla python -c "import flash_mla" 2>/dev/null; then
  timeout 220 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > /tmp/build.txt 2>&1
  echo "build $(( $(date +%s)-t0 )) s"; tail -1 /tmp/build.txt
fi
bench() {  # name backends cases...
  local name=$1 backends=$2; shift 2
  local left=$(( deadline - $(date +%s) )); [ $left -lt 20 ] && { echo "$name skipped (deadline)"; return; }
  local C=""; for c in "$@"; do C="$C --case $c"; done
  PYTHONPATH=build/flashmla:src timeout $left python -m mlakit.bench decode --backends $backends --no-baseline --clean-l2 $C \
    --json $OUT/$name.json --plot /tmp/$name.png 2>&1 | grep -v "Warn\|_sync_debug" > $OUT/$name.txt
  echo "$name t=$(( $(date +%s)-t0 )) s rows=$(grep -c ' us ' $OUT/$name.txt)"
}
S128=""; for b in 16 64 128; do for n in 1024 4096 16384; do S128="$S128 128,$b,$n"; done; done; S128="$S128 128,64,ragged"
bench h128-bf16-q1 triton,flashmla $(for s in $S128; do echo $s,1; done)
bench h128-bf16-q2 triton,flashmla $(for s in $S128; do echo $s,2; done)
bench h16-bf16 triton,flashmla 16,64,ragged,1 16,64,ragged,2 16,64,4096,1
