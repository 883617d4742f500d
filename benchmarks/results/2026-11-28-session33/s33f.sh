#!/usr/bin/env bash
# s33e's profile shows one of a call's two launches costing 7-10 us in Triton's C entry and the other under 1.3 us:
# whether the costly one is the combine's programmatic dependent launch (COMBINE_AFTER_SPLIT off: a plain launch).
set -uo pipefail
R=$OUT/s33f
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments:tests
timeout 150 python benchmarks/experiments/host_cost_setting_ab.py triton_decode.COMBINE_AFTER_SPLIT \
  pdl=True plain=False -- --profile decode,128,1,1024,1 decode,128,64,1024,2 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/profile.txt
grep "us host\|under the profiler\|launcher\|launch.py" $R/profile.txt
