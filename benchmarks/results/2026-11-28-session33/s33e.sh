#!/usr/bin/env bash
# Where v96's extra 13 us of eager host time goes (s33b-host-v96.txt): host time, then cProfile over 2000 eager
# mla_decode(out=) calls, SHARE_MERGES_BY_COMBINE off / on, the functions with the most own time a call (the
# combine's launch: Triton's C entry or its Python launcher; CachedLaunch's own bookkeeping).
set -uo pipefail
R=$OUT/s33e
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments:tests
timeout 220 python benchmarks/experiments/host_cost_setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE \
  off=False on=True -- --profile decode,128,64,4096,2 decode,128,1,1024,1 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/profile.txt
cat $R/profile.txt
