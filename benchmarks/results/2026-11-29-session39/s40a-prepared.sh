#!/usr/bin/env bash
# Prepared, not run (the thirty-ninth session's device time is spent). The 128-head ragged q2 batch ran 1.7% slower
# under Triton 3.7.1 (s39b) than under 3.6 (session 35's s35c), where every other case ran 0.4-3.7% faster, and the plan
# model puts its count plan 3% under the share plan the plan kernel takes (NOTES.md "Thirty-ninth session"). Equal
# shares on and off on the ragged batches (setting_ab.py: graph replay, clean L2, the variants interleaved in one
# process), under the image's Triton 3.6 and then under 3.7.1 (packed; carry ["build/triton37"]).
set -uo pipefail
R=$OUT/s40a
mkdir -p $R
source benchmarks/experiments/with_packed_triton.sh build/triton37
cases="128,64,ragged,2 128,64,ragged,1 128,64,ragged,2,fp8_e4m3 64,64,ragged,2 128,40,4096,2"
for version in t36 t37; do
  path=src:benchmarks/experiments
  [ $version = t37 ] && path=$PACKED_TRITON:$path
  PYTHONPATH=$path timeout 240 python benchmarks/experiments/setting_ab.py decode_split_plan.EQUAL_SHARES \
    shares=True counts=False -- $cases 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-$version.txt
  tail -n 12 $R/ab-$version.txt
done
