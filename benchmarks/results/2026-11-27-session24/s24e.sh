#!/usr/bin/env bash
# Session 24, call e: the 32-row tile's threshold re-scanned on v84 (WIDE_MIN_TILES_PER_PROGRAM: 12 today; 0 takes
# the 32-row tile on every hinted batch), 16 heads x 2 tokens and 32 heads x 1, fp8 pages, e4m3 scores, the hint.
set -uo pipefail
mkdir -p $OUT/s24e
R=$OUT/s24e
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
CASES="16,48,4096,2 16,32,4096,2 16,64,2048,2 16,16,8192,2 16,24,4096,2 16,48,2048,2 16,64,1024,2 16,256,256,2
 16,128,512,2 16,8,8192,2 16,4,16384,2 16,32,1024,2 16,16,1024,2 16,1,16384,2 16,4,4096,2 32,64,2048,1 32,16,1024,1"
FP8=$(for c in $CASES; do echo -n "$c,fp8_e4m3 "; done)
(cd benchmarks/experiments && PYTHONPATH=../../src:. timeout 500 python setting_ab.py \
  hopper_narrow_decode.WIDE_MIN_TILES_PER_PROGRAM t12=12 t6=6 t3=3 t1=1 t0=0 -- --e4m3-scores --hinted $FP8 \
  > $R/wide-threshold-v84.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/wide-threshold-v84.txt)
tar -C $OUT -czf $OUT/s24e.tgz s24e && rm -rf $R
