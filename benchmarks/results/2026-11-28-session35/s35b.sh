#!/usr/bin/env bash
# v100 candidate: an equal-share plan's piece cost apart from the unit cost (decode_split_plan.
# HOPPER_SHARE_PIECE_COST_TILES, unit cost 9). plan_model-style scan (CPU, 132 SMs) lists the batches whose plans
# turn to shares at piece costs 8 / 7 / 6 / 5; A/B on those (graph replay, flushed L2, one process), then the GPU demo.
set -uo pipefail
R=$OUT/s35b
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout 400 python benchmarks/experiments/setting_ab.py decode_split_plan.HOPPER_SHARE_PIECE_COST_TILES \
  p9=9 p8=8 p7=7 p6=6 p5=5 -- \
  128,40,1024,2 128,80,1024,1 128,80,1024,1,fp8_e4m3 64,80,1024,2 \
  128,48,4096,2 128,96,2048,1 128,96,4096,1 128,24,4096,1 128,48,2048,2 128,12,4096,2 128,80,1024,2 128,48,1024,2 \
  64,96,4096,2 128,96,4096,1,fp8_e4m3 \
  128,24,32768,2 128,48,8192,2 128,96,8192,1 128,56,4096,1 128,40,1024,1 \
  128,96,2048,2 128,12,16384,1 128,48,1024,1 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-piece-cost.txt
tail -n 23 $R/ab-piece-cost.txt
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 4 $R/demo-gpu.txt
