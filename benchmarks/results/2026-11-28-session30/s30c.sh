#!/usr/bin/env bash
# The in-kernel merge against the combine on the 128-head plans that split (share plans, ragged) and the cost of a
# combine launched for nothing on uniform ones: MERGE_MAX_SPLITS 4 (HEAD) against 1 (the combine merges every plan).
set -uo pipefail
R=$OUT/s30c
mkdir -p $R
PYTHONPATH=src:benchmarks/experiments timeout 400 python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.MERGE_MAX_SPLITS m4=4 m1=1 -- \
  128,40,4096,2 128,40,8192,2 128,64,ragged,1 128,64,ragged,2 128,64,4096,2 128,128,4096,1 128,64,1024,2 \
  128,40,4096,2,fp8_e4m3 128,24,4096,2 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-merge.txt
tail -n 40 $R/ab-merge.txt
