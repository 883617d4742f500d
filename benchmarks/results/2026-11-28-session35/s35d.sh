#!/usr/bin/env bash
# After v100: equal shares on batches of (nearly) full waves, which a piece cost of 0 gives them (a CPU scan: 79 of
# 288 batches turn to shares at 0 that keep their split counts at 7): 7 / 0 (graph replay, flushed L2, one process).
set -uo pipefail
R=$OUT/s35d
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout 250 python benchmarks/experiments/setting_ab.py decode_split_plan.HOPPER_SHARE_PIECE_COST_TILES p7=7 p0=0 -- \
  128,64,4096,2 128,64,8192,2 128,128,4096,1 128,64,4096,1 128,64,1024,1 128,32,4096,2 128,16,8192,2 \
  128,8,16384,1 128,12,8192,1 128,96,16384,2 64,64,4096,2 64,16,8192,2 128,64,4096,2,fp8_e4m3 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-forced-shares.txt
tail -n 13 $R/ab-forced-shares.txt
