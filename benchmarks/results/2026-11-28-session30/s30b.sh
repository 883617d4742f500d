#!/usr/bin/env bash
# Where the 128-head gaps to FlashMLA sit, kernel by kernel (main kernel, combine, plan), on the cases that miss 1.0x
# in s30a (H200): the share-plan batches (40 x 4096 / 8192 q2), the ragged batch, the long q2 batches; then the
# seesaw's timeline (per-program ends, the tail) on the ragged q1 batch and 40 x 4096 q2. Carry ["build/flashmla-src"].
set -uo pipefail
R=$OUT/s30b
mkdir -p $R
benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 200 > $R/build-line.txt 2>&1
cat $R/build-line.txt
PYTHONPATH=build/flashmla:src:benchmarks/experiments timeout 200 python benchmarks/experiments/peer_kernel_breakdown.py \
  128,40,4096,2 128,40,8192,2 128,64,ragged,1 128,64,ragged,2 128,64,16384,2 128,64,4096,2 128,24,16384,2 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/breakdown.txt
cat $R/breakdown.txt
python benchmarks/experiments/seesaw_timeline.py stamp .device/tl > $R/timeline.txt 2>&1
PYTHONPATH=.device/tl/src:tests:benchmarks/experiments timeout 150 python benchmarks/experiments/seesaw_timeline.py run \
  128,64,ragged,1 128,40,4096,2 2>&1 | grep -v "Warn\|_sync_debug" >> $R/timeline.txt
tail -n 60 $R/timeline.txt
