#!/usr/bin/env bash
# Prepared for the next session (not run; no carry): what v96's extra launch costs an eager call (host µs of
# `mla_decode(out=)`, SHARE_MERGES_BY_COMBINE off / on alternating in one process: the README's host table predates
# it), and the share-only combine's program size (SHARE_COMBINE_ROWS 8 / 16 / 32 rows, as many warps) on share plans
# and on plans where it finds nothing (graph replay, flushed L2).
set -uo pipefail
R=$OUT/s33c
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments:tests
timeout 150 python benchmarks/experiments/host_cost_setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE \
  off=False on=True -- decode,128,64,4096,2 decode,128,64,1024,2 decode,128,1,1024,1 2>&1 \
  | grep -v "Warn\|_sync_debug" > $R/host-v96.txt
cat $R/host-v96.txt
timeout 250 python benchmarks/experiments/setting_ab.py triton_decode.SHARE_COMBINE_ROWS r8=8 r16=16 r32=32 -- \
  128,40,4096,2 128,40,8192,2 128,64,1024,2 128,64,ragged,1 128,128,1024,1 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/ab-share-combine-rows.txt
tail -n 5 $R/ab-share-combine-rows.txt
