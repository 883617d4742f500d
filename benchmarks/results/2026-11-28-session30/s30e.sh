#!/usr/bin/env bash
# Can the combine take share plans' merges without costing the plans that split nothing? (1) HEAD's combine against one
# of four times the rows a program (COMBINE_VALUES 4096 -> 16384: 2 -> 8 rows at whole-row tiling, 4x fewer
# programs) where the combine runs; (2) in a tree with the larger combine programs (build/dev/v16), the in-kernel
# merge against the combine everywhere (MERGE_MAX_SPLITS 4 / 1): what a combine launched for nothing costs there.
# Carry ["build/dev"].
set -uo pipefail
R=$OUT/s30e
mkdir -p $R
PYTHONPATH=src:benchmarks/experiments timeout 200 python benchmarks/experiments/setting_ab.py \
  triton_decode.COMBINE_VALUES v4k=4096 v16k=16384 -- \
  128,24,16384,2 128,24,16384,1 128,24,4096,2 16,64,ragged,2 16,16,4096,1 128,8,16384,2 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-combine-values.txt
tail -n 7 $R/ab-combine-values.txt
PYTHONPATH=build/dev/v16/src:benchmarks/experiments timeout 250 python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.MERGE_MAX_SPLITS m4=4 m1=1 -- \
  128,40,4096,2 128,40,8192,2 128,64,ragged,1 128,64,ragged,2 128,64,4096,2 128,128,4096,1 128,64,1024,2 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-merge-v16.txt
tail -n 8 $R/ab-merge-v16.txt
