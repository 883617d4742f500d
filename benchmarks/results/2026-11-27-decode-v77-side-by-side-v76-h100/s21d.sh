#!/usr/bin/env bash
# Session 21, call 4: FlashMLA 9241ae3 built, HEAD (v76) beside it in one process, clean L2: the rest of issue 23's
# grid (16 and 128 heads, q1 / q2, bf16, page 64): 128 heads at batch 1, 16 heads everywhere.
# carry: build/dev build/flashmla-src (FlashMLA 9241ae3 with cutlass 147f5673 include/ and tools/util/include/)
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s); deadline=$(( t0 + ${BUDGET_S:-570} ))
timeout 220 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $OUT/build.txt 2>&1
echo "build $(( $(date +%s)-t0 )) s"; tail -1 $OUT/build.txt
bench() {  # name cases...
  local name=$1; shift
  local left=$(( deadline - $(date +%s) )); [ $left -lt 20 ] && { echo "$name skipped (deadline)"; return; }
  local C=""; for c in "$@"; do C="$C --case $c"; done
  PYTHONPATH=build/flashmla:src timeout $left python -m mlakit.bench decode --backends triton,flashmla --no-baseline \
    --clean-l2 $C --json $OUT/$name.json --plot /tmp/$name.png 2>&1 | grep -v "Warn\|_sync_debug" > $OUT/$name.txt
  echo "$name t=$(( $(date +%s)-t0 )) s rows=$(grep -c ' us ' $OUT/$name.txt)"
}
S=""; for b in 16 64 128; do for n in 1024 4096 16384; do S="$S $b,$n"; done; done
bench side-by-side-clean-h128-bf16-batch1 $(for n in 1024 4096 16384; do for q in 1 2; do echo 128,1,$n,$q; done; done)
bench side-by-side-clean-h16-bf16-grid $(for s in 1,1024 1,4096 1,16384 $S 64,ragged; do for q in 1 2; do echo 16,$s,$q; done; done)
