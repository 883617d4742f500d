#!/usr/bin/env bash
# v90's L2 prefetch of a program's next unit on 16-bit pages, where unit changes are staggered: since v97 a ragged batch
# takes an equal-share plan (snake order, so its next unit is known and the prefetch runs), while v90 measured 16-bit
# pages only on lockstep batches (-0.4 to -5%: all programs' prefetches at once slowed the loops they ran under) and on
# ragged plans of the counter order (no prefetch). setting_ab.py (graph replay, clean L2, interleaved; Triton 3.6):
# hopper_decode.dispatch.L2_PREFETCH_PAIRS_16BIT 0 / 1 over the ragged batches, two uniform share plans and one lockstep
# control; then the fp8 setting 1 / 0 on the fp8 ragged batches (on there since v97, never measured).
set -uo pipefail
R=$OUT/s40e
mkdir -p $R
cases="128,64,ragged,2 128,64,ragged,1 64,64,ragged,2 128,40,8192,2 128,24,16384,2 128,64,1024,2"
PYTHONPATH=src:benchmarks/experiments timeout 330 python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.L2_PREFETCH_PAIRS_16BIT off=0 p1=1 -- $cases 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/ab-prefetch-16bit.txt
tail -n 6 $R/ab-prefetch-16bit.txt
PYTHONPATH=src:benchmarks/experiments timeout 170 python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.L2_PREFETCH_PAIRS_FP8 p1=1 off=0 -- 128,64,ragged,2,fp8_e4m3 128,64,ragged,1,fp8_e4m3 2>&1 \
  | grep -v "Warn\|_sync_debug" > $R/ab-prefetch-fp8.txt
tail -n 2 $R/ab-prefetch-fp8.txt
