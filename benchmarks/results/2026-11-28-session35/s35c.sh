#!/usr/bin/env bash
# v100 (HOPPER_SHARE_PIECE_COST_TILES 7): (1) 9 / 7 on the batches of the CPU scan that change at 7 and s35b did not
# measure, a few off the scan's grid and uneven lengths (graph replay, flushed L2, one process); (2) where issue 23
# stands after v99 / v100: 128 and 16 heads beside FlashMLA 9241ae3 in one process (clean L2), the v100 batches
# first. Carry ["build/flashmla-src"].
set -uo pipefail
R=$OUT/s35c
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout 150 python benchmarks/experiments/setting_ab.py decode_split_plan.HOPPER_SHARE_PIECE_COST_TILES p7=7 p9=9 -- \
  128,24,2048,2 128,48,2048,1 128,56,2048,2 128,96,1024,1 64,24,4096,2 64,48,2048,2 64,96,1024,2 64,96,2048,2 \
  128,48,2048,2,fp8_e4m3 128,36,3000,1 128,72,3000,1 128,100,2500,1 128,30,6000,2 128,96,~2048,1 128,48,~4096,2 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-piece-cost.txt
tail -n 15 $R/ab-piece-cost.txt
unset PYTHONPATH
timeout 420 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 410 \
  "v100=128,48,4096,2 128,96,2048,1 128,96,4096,1 128,48,2048,2 128,24,4096,1 128,80,1024,1 128,40,1024,2" \
  "q2=128,64,4096,2 128,128,4096,2 128,64,16384,2 128,64,1024,2 128,24,16384,2 128,40,8192,2" \
  "ragged=128,64,ragged,1 128,64,ragged,2 16,64,ragged,1 16,64,ragged,2" \
  "q1=128,64,1024,1 128,64,4096,1 128,128,4096,1 16,16,4096,1 16,128,1024,2 16,16,1024,2"
for f in v100 q2 ragged q1; do grep " us " $R/$f.txt | cut -c1-75; done
