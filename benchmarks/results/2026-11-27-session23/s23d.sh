#!/usr/bin/env bash
# Session 23, call d: v82 (the narrow kernel's Q loads issued before its first tiles' copies) against HEAD, each tree
# in its own process, two passes (e4m3_scores_ab.py: bf16, fp8 default, e4m3 scores unhinted / hinted), then v82's
# timeline.
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/device-d.txt
CASES="16,64,4096,2 16,16,16384,2 16,128,16384,2 16,64,ragged,2 16,64,4096,1 16,64,1024,2"
for pass in 1 2; do
  for tree in build/dev/base/src src; do
    name=$(basename $(dirname $tree)); [ "$tree" = src ] && name=v82
    PYTHONPATH=$tree:benchmarks/experiments timeout 130 python benchmarks/experiments/e4m3_scores_ab.py \
      --json $OUT/ab-$name-$pass.json $CASES > $OUT/ab-$name-$pass.txt 2>&1
    echo "rc $?" >> $OUT/ab-$name-$pass.txt
  done
done
python benchmarks/experiments/narrow_timeline.py stamp .device/ntl > /dev/null
PYTHONPATH=.device/ntl/src:benchmarks/experiments timeout 100 python benchmarks/experiments/narrow_timeline.py run \
  --e4m3-scores --hinted 16,64,4096,2,fp8_e4m3 16,128,16384,2,fp8_e4m3 > $OUT/timeline-v82-e4m3-hinted.txt 2>&1
PYTHONPATH=.device/ntl/src:benchmarks/experiments timeout 100 python benchmarks/experiments/narrow_timeline.py run \
  16,64,4096,2,fp8_e4m3 16,64,4096,1,fp8_e4m3 > $OUT/timeline-v82-fp8.txt 2>&1
grep -h "clean-l2\|rc " $OUT/ab-*.txt
grep -h -A7 "graph replay" $OUT/timeline-v82-*.txt | grep -v " min "
