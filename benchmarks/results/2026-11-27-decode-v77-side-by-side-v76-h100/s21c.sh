#!/usr/bin/env bash
# Session 21, call 3: where issue 23's fp8 targets stand on HEAD (v76), clean L2, our kernels only: 128 heads bf16 /
# fp8 (default fp16 MMAs) / fp8 with e4m3 scores (the triton_fp8 backend) on batches of >= 64k tokens, 16 heads on
# large batches.
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s); deadline=$(( t0 + ${BUDGET_S:-570} ))
bench() {  # name backends cases...
  local name=$1 backends=$2; shift 2
  local left=$(( deadline - $(date +%s) )); [ $left -lt 20 ] && { echo "$name skipped (deadline)"; return; }
  local C=""; for c in "$@"; do C="$C --case $c"; done
  PYTHONPATH=src timeout $left python -m mlakit.bench decode --backends $backends --no-baseline \
    --clean-l2 $C --json $OUT/$name.json --plot /tmp/$name.png 2>&1 | grep -v "Warn\|_sync_debug" > $OUT/$name.txt
  echo "$name t=$(( $(date +%s)-t0 )) s rows=$(grep -c ' us ' $OUT/$name.txt)"
}
cases() {  # heads q_lens dtypes shapes...
  local h=$1 qs=$2 ds=$3; shift 3
  for s in "$@"; do for q in $qs; do for d in $ds; do echo $h,$s,$q,$d; done; done; done
}
bench fp8-h128 triton,triton_fp8 $(cases 128 "1 2" "bf16 fp8_e4m3" 16,16384 64,4096 64,16384 128,4096 128,16384 64,ragged)
bench fp8-h16 triton,triton_fp8 $(cases 16 "1 2" "bf16 fp8_e4m3" 64,4096 128,16384 64,ragged)
