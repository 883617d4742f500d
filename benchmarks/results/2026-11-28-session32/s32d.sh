#!/usr/bin/env bash
# Session 32, fourth call (no carry): the combine's idle programs leaving without waiting for the split pass
# (triton_decode.COMBINE_IDLE_EXIT; the first program still waits). (1) Off / on where the combine runs today (16h
# plans with split ceilings above 4, 128h 24 x 16384 q2 and 16 x 16384 q1, the narrow fp8 kernel); (2) off / on with the
# combine for every plan (MERGE_MAX_SPLITS 1): what an empty combine then costs (64 x 1024 / 64 x 4096 q2); (3) with it
# on, the in-kernel merges (4) against the combine for every plan (1).
set -uo pipefail
R=$OUT/s32d
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
AB="python benchmarks/experiments/setting_ab.py"
timeout 170 $AB triton_decode.COMBINE_IDLE_EXIT off=False on=True -- 16,64,ragged,1 16,64,ragged,2 16,64,4096,2 \
  16,16,4096,1 128,24,16384,2 128,16,16384,1 16,64,4096,2,fp8_e4m3 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-idle-default.txt
tail -n 7 $R/ab-idle-default.txt
CASES="128,40,4096,2 128,40,8192,2 128,64,ragged,2 128,64,ragged,1 128,64,1024,2 128,64,4096,2"
timeout 150 $AB triton_decode.COMBINE_IDLE_EXIT off=False on=True +hopper_decode.dispatch.MERGE_MAX_SPLITS=1 -- $CASES \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-idle-m1.txt
tail -n 6 $R/ab-idle-m1.txt
timeout 150 $AB hopper_decode.dispatch.MERGE_MAX_SPLITS m4=4 m1=1 +triton_decode.COMBINE_IDLE_EXIT=True -- $CASES 2>&1 \
  | grep -v "Warn\|_sync_debug" > $R/ab-merge-idle.txt
tail -n 6 $R/ab-merge-idle.txt
