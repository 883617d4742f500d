#!/usr/bin/env bash
# Prepared for the next session (not run: this session's device time is spent). Where the seesaw merges its splits
# after v95 (16-bit partials: its in-kernel merge and the combine both read half the bytes):
# (1) MERGE_MAX_SPLITS 4 / 8: the 16-head plans whose ceiling is 5-8 (the ragged batch, 1.01-1.02x FlashMLA, pays a
#     3.5-4.8 us combine; 64 x 4096 takes 2 splits under a ceiling of 7 and launches the combine for them) and 128h
#     24 x 16384 q2 (ceiling 5); controls with ceilings above 8 (16 x 4096 q1: 25; 128h 16 x 16384 q1: 13);
# (2) MERGE_MAX_SPLITS 4 / 1 (the combine for every plan): session 30's probe (s30c) after v95, on the share plans it
#     favoured (-2.0 to -2.8%) and the plans it cost (64 x 1024 q2 +6.9%, ragged +0.3-2.3%).
# Both in one process per probe (setting_ab.py: outputs compared, flushed L2, interleaved). No carry needed.
set -uo pipefail
R=$OUT/s32a
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
AB="python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.MERGE_MAX_SPLITS"
timeout 200 $AB m4=4 m8=8 -- 16,64,ragged,1 16,64,ragged,2 16,64,4096,2 16,64,4096,1 16,128,1024,2 16,16,4096,1 \
  128,24,16384,2 128,16,16384,1 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-merge8.txt
tail -n 8 $R/ab-merge8.txt
timeout 170 $AB m4=4 m1=1 -- 128,40,4096,2 128,40,8192,2 128,64,1024,2 128,64,ragged,1 128,64,ragged,2 \
  128,40,4096,2,fp8_e4m3 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-merge1.txt
tail -n 6 $R/ab-merge1.txt
