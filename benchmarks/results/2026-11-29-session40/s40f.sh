#!/usr/bin/env bash
# s40e found v90's L2 prefetch 3-7% faster on the fp8 ragged batches' share plans, one tile pair ahead. How far ahead
# pays there (v90b: two pairs gained nothing on fp8's lockstep batches)? setting_ab.py, Triton 3.6,
# hopper_decode.dispatch.L2_PREFETCH_PAIRS_FP8 1 / 2 / 3, fp8 ragged q1 / q2 and two uniform fp8 batches (one of shares),
# by default and with e4m3 scores and the hint (the triton_fp8 backend's plan).
set -uo pipefail
R=$OUT/s40f
mkdir -p $R
cases="128,64,ragged,2,fp8_e4m3 128,64,ragged,1,fp8_e4m3 128,64,4096,2,fp8_e4m3 128,40,4096,2,fp8_e4m3"
for flags in default e4m3; do
  extra=""; [ $flags = e4m3 ] && extra="--e4m3-scores --hinted"
  PYTHONPATH=src:benchmarks/experiments timeout 170 python benchmarks/experiments/setting_ab.py \
    hopper_decode.dispatch.L2_PREFETCH_PAIRS_FP8 p1=1 p2=2 p3=3 -- $extra $cases 2>&1 | grep -v "Warn\|_sync_debug" \
    > $R/ab-prefetch-fp8-$flags.txt
  tail -n 4 $R/ab-prefetch-fp8-$flags.txt
done
