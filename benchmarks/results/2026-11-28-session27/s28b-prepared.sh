#!/usr/bin/env bash
# Prepared for the next session (not run): v89, call 2 of 2 (after s28a-prepared.sh's tests pass; the same build/dev
# trees, carried): an A/B against HEAD in alternating processes, clean L2 (the prediction: 128h 64 x 1024 q2 -3%,
# 128 x 4096 q1 -1%, 40 x 4096 q2 with shares -3%, ragged level: no prefetch there, 16h bf16 -2 to -4%, fp8 at risk
# from spills), then v89's timeline on 64 x 1024 q2 (the later unit's wait to its first scores should drop).
set -uo pipefail
R=$OUT/s28b
mkdir -p $R
timeout 330 benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src build/dev/v89/src -- \
  --case 128,64,1024,2,bf16,64 --case 128,128,4096,1,bf16,64 --case 128,40,4096,2,bf16,64 \
  --case 128,64,ragged,2,bf16,64 --case 16,128,1024,1,bf16,64 --case 128,64,4096,1,fp8_e4m3,64 \
  --backends triton --no-baseline --clean-l2 > $R/ab-v89.txt 2>&1
echo "ab rc $?" >> $R/ab-v89.txt
cat $R/ab-v89.txt
cd build/dev/v89  # v89's tree with its timeline tool's anchors
PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/seesaw_timeline.py stamp .device/tl > $R/stamp.txt 2>&1
PYTHONPATH=.device/tl/src:benchmarks/experiments:../../../tests timeout 120 python benchmarks/experiments/seesaw_timeline.py \
  run 128,64,1024,2 > $R/timeline-v89.txt 2>&1
grep -h "graph replay\|medians a program" $R/timeline-v89.txt
