#!/usr/bin/env bash
# Session 23, call c: the narrow fp8 kernel's in-kernel timeline (narrow_timeline.py) at 16 heads, e4m3 scores with
# the hint (32-row tile) and the default fp16 MMAs (16-row tiles).
set -uo pipefail
python benchmarks/experiments/narrow_timeline.py stamp .device/ntl > /dev/null
export PYTHONPATH=.device/ntl/src:benchmarks/experiments
CASES="16,64,4096,2,fp8_e4m3 16,16,16384,2,fp8_e4m3 16,128,16384,2,fp8_e4m3 16,64,ragged,2,fp8_e4m3 16,32,4096,2,fp8_e4m3"
timeout 200 python benchmarks/experiments/narrow_timeline.py run --e4m3-scores --hinted $CASES > $OUT/narrow-timeline-e4m3-hinted.txt 2>&1
timeout 150 python benchmarks/experiments/narrow_timeline.py run 16,64,4096,2,fp8_e4m3 16,64,4096,1,fp8_e4m3 16,128,16384,1,fp8_e4m3 > $OUT/narrow-timeline-fp8.txt 2>&1
cat $OUT/narrow-timeline-*.txt | grep -v Warning | grep -v _warn
