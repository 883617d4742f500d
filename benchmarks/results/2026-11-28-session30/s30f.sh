#!/usr/bin/env bash
# The split ceiling's oversubscription (decode_split_plan.OVERSUBSCRIPTION, 3 waves of programs today): a higher
# ceiling lets a ragged batch's longest sequences take more splits (128h ragged q2 is capped at 2 today) and moves
# the 40-sequence share plans past MERGE_MAX_SPLITS to the combine (s30c: 2-3% faster there). One process, flushed L2.
set -uo pipefail
R=$OUT/s30f
mkdir -p $R
PYTHONPATH=src:benchmarks/experiments timeout 330 python benchmarks/experiments/setting_ab.py \
  decode_split_plan.OVERSUBSCRIPTION o3=3 o4=4 o5=5 o6=6 -- \
  128,64,ragged,1 128,64,ragged,2 128,40,4096,2 128,40,8192,2 128,64,4096,2 128,64,1024,2 16,64,ragged,2 \
  128,64,ragged,2,fp8_e4m3 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-oversubscription.txt
tail -n 9 $R/ab-oversubscription.txt
