#!/usr/bin/env bash
# Session 32, third call (no carry): the combine for every plan (MERGE_MAX_SPLITS 1) under larger combine programs
# (COMBINE_VALUES 4096 / 16384 / 32768: 2 / 8 / 16 rows of 512 columns a program), under the benchmark's method (graph
# replay, flushed L2, interleaved): what an empty combine costs (64 x 1024 q2, 128 x 4096 q2, 64 x 4096 q2: no split)
# against what the share plans and the ragged q2 batch gain; then the in-kernel merges (4) as the reference.
set -uo pipefail
R=$OUT/s32c
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
AB="python benchmarks/experiments/setting_ab.py"
CASES="128,40,4096,2 128,40,8192,2 128,64,ragged,2 128,64,1024,2 128,64,4096,2 128,128,4096,2 128,64,ragged,1"
timeout 280 $AB triton_decode.COMBINE_VALUES v4k=4096 v16k=16384 v32k=32768 +hopper_decode.dispatch.MERGE_MAX_SPLITS=1 \
  -- $CASES 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-combine-values.txt
tail -n 7 $R/ab-combine-values.txt
timeout 200 $AB hopper_decode.dispatch.MERGE_MAX_SPLITS m4=4 m1=1 +triton_decode.COMBINE_VALUES=16384 -- $CASES 2>&1 \
  | grep -v "Warn\|_sync_debug" > $R/ab-merge-v16k.txt
tail -n 7 $R/ab-merge-v16k.txt
