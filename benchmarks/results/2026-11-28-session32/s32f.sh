#!/usr/bin/env bash
# Session 32, sixth call (carry ["build/flashmla-src"]): v96 (the default now) beside FlashMLA 9241ae3 in one process
# (clean L2), the 128-head cases it moves; then a second A/B round of v96 on the cases it cost in s32e.
set -uo pipefail
R=$OUT/s32f
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout 330 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 320 \
  "h128=128,40,4096,2 128,40,8192,2 128,64,1024,2 128,64,4096,2 128,64,ragged,1 128,64,ragged,2"
grep " us " $R/h128.txt | cut -c1-120
timeout 200 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE off=False on=True \
  -- 128,40,4096,2 128,64,1024,2 128,64,ragged,1 128,64,ragged,2 128,128,1024,1 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/ab-v96-round2.txt
tail -n 5 $R/ab-v96-round2.txt
