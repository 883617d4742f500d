#!/usr/bin/env bash
# Session 21, call 2: HEAD's kernel (v76) with the merge test at latent widths 256 / 128 (new parameters), then
# FlashMLA 9241ae3 built and v76 beside it in one process, clean L2: 128 heads batched q1 / q2 (ragged included),
# 16 heads ragged q1 / q2.
# carry: build/dev build/flashmla-src (FlashMLA 9241ae3 with cutlass 147f5673 include/ and tools/util/include/)
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s); deadline=$(( t0 + ${BUDGET_S:-560} ))
PYTHONPATH=src timeout 120 python -m pytest -q -n 8 tests/test_triton_decode_gpu.py -k "merges or padded" > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
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
S128=""; for b in 16 64 128; do for n in 1024 4096 16384; do S128="$S128 128,$b,$n"; done; done; S128="$S128 128,64,ragged"
bench side-by-side-clean-h128-bf16-q2 $(for s in $S128; do echo $s,2; done)
bench side-by-side-clean-h128-bf16-q1 $(for s in $S128; do echo $s,1; done)
bench side-by-side-clean-h16-bf16 16,64,ragged,1 16,64,ragged,2 16,16,1024,1 16,16,1024,2 16,64,4096,1
