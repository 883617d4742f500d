#!/usr/bin/env bash
# Session 32, second call (carry ["build/flashmla-src"]): how long a call runs past its main kernel, ours with the
# in-kernel merges (MERGE_MAX_SPLITS 4) and with the combine for every plan (1), beside FlashMLA 9241ae3's main kernel
# and combine on the same inputs (kernel_spans.py: device timestamps, flushed L2, medians of 20 calls); then the
# combine's program size (COMBINE_VALUES) with the combine for every plan.
set -uo pipefail
R=$OUT/s32b
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments:build/flashmla
t0=$(date +%s)
timeout 240 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $R/build.txt 2>&1
echo "build $(( $(date +%s) - t0 )) s: $(tail -1 $R/build.txt)"
SP="python benchmarks/experiments/kernel_spans.py"
timeout 200 $SP hopper_decode.dispatch.MERGE_MAX_SPLITS m4=4 m1=1 -- --flashmla 128,40,4096,2 128,40,8192,2 \
  128,64,ragged,1 128,64,ragged,2 128,64,1024,2 128,64,4096,2 16,64,ragged,1 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/spans-merge.txt
cut -c1-150 $R/spans-merge.txt
timeout 120 $SP triton_decode.COMBINE_VALUES v4k=4096 v8k=8192 v16k=16384 +hopper_decode.dispatch.MERGE_MAX_SPLITS=1 \
  -- 128,40,4096,2 128,64,ragged,2 128,64,1024,2 2>&1 | grep -v "Warn\|_sync_debug" > $R/spans-combine.txt
cut -c1-150 $R/spans-combine.txt
