#!/usr/bin/env bash
# Session 24, call b: the 32-row tile's threshold re-scanned after v82 / v83 (16 heads x 2 tokens, fp8 pages, e4m3
# scores, the plan told the batch's cached tokens), and v83's stamped timeline. Outputs bundled into one archive.
set -uo pipefail
mkdir -p $OUT/s24b
R=$OUT/s24b
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
CASES="16,48,4096,2,fp8_e4m3 16,32,4096,2,fp8_e4m3 16,16,8192,2,fp8_e4m3 16,64,2048,2,fp8_e4m3 16,64,1024,2,fp8_e4m3 16,256,256,2,fp8_e4m3 16,64,4096,2,fp8_e4m3"
(cd benchmarks/experiments && PYTHONPATH=../../src:. timeout 330 python setting_ab.py \
  hopper_narrow_decode.WIDE_MIN_TILES_PER_PROGRAM t12=12 t8=8 t6=6 t3=3 -- --e4m3-scores --hinted $CASES \
  > $R/wide-threshold.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/wide-threshold.txt)
python benchmarks/experiments/narrow_timeline.py stamp .device/ntl > /dev/null
PYTHONPATH=.device/ntl/src:benchmarks/experiments timeout $((570 - SECONDS)) python benchmarks/experiments/narrow_timeline.py run \
  --e4m3-scores --hinted 16,64,4096,2,fp8_e4m3 16,16,16384,2,fp8_e4m3 > $R/timeline-v83-e4m3-hinted.txt 2>&1
echo "rc $? after ${SECONDS}s" >> $R/timeline-v83-e4m3-hinted.txt
tar -C $OUT -czf $OUT/s24b.tgz s24b && rm -rf $R
