#!/usr/bin/env bash
# Prepared in the thirty-ninth session, run in the fortieth. Carry ["build/triton37"]. setting_ab.py (graph replay, clean L2, variants interleaved in one
# process): (1) v102 under the image's Triton 3.6, decode_split_plan.SHARES_BY_COST off / on, over the ragged batches,
# uniform share batches and batches that take shares only by cost (NOTES.md "v102"; the model's figures:
# results/2026-11-29-session39/v102-plan-model.txt); (2) equal shares on / off on the ragged batches under 3.6 and
# 3.7.1: is ragged q2's +1.7% under 3.7.1 (s39b against s35c) the share plan (the model's count plan is 3% shorter
# than the equal-tile share plan) or noise?
set -uo pipefail
R=$OUT/s40b
mkdir -p $R
source benchmarks/experiments/with_packed_triton.sh build/triton37
v102="128,64,ragged,2 128,64,ragged,1 128,64,ragged,2,fp8_e4m3 64,64,ragged,2 128,40,8192,2 128,40,1024,2 \
128,24,4096,1 128,40,2048,2 128,64,~4096,2 128,48,8192,2 128,96,8192,1 128,56,4096,1 128,128,~1024,1 128,16,~8192,1"
PYTHONPATH=src:benchmarks/experiments timeout 330 python benchmarks/experiments/setting_ab.py \
  decode_split_plan.SHARES_BY_COST tiles=False cost=True -- $v102 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-v102.txt
tail -n 16 $R/ab-v102.txt
ragged="128,64,ragged,2 128,64,ragged,1 128,64,ragged,2,fp8_e4m3"
for version in t36 t37; do
  path=src:benchmarks/experiments
  [ $version = t37 ] && path=$PACKED_TRITON:$path
  PYTHONPATH=$path timeout 110 python benchmarks/experiments/setting_ab.py decode_split_plan.EQUAL_SHARES \
    shares=True counts=False -- $ragged 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-shares-$version.txt
  tail -n 5 $R/ab-shares-$version.txt
done
