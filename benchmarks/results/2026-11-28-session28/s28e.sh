#!/usr/bin/env bash
# v90 (second call): the next unit's L2 prefetch by bulk copies (the TMA unit) or by 128-byte lines (the load path),
# 1-4 tile pairs ahead, against none; one process, clean L2, CUDA graphs. s28d's A/B (bulk only) lost 1.7-4.8% on 128h
# bf16 multi-unit batches and gained 2.3% on fp8: here more fp8 cases, and whether line prefetches avoid the loss.
set -uo pipefail
R=$OUT/s28e
mkdir -p $R
export PYTHONPATH=src
timeout 420 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH "off=(0,False)" \
  "bulk1=(1,False)" "lines1=(1,True)" "lines2=(2,True)" "lines4=(4,True)" -- \
  128,64,1024,2 128,128,4096,1 128,40,4096,2 128,64,4096,2 128,64,4096,1,fp8_e4m3 128,64,4096,2,fp8_e4m3 \
  128,128,4096,1,fp8_e4m3 128,40,4096,2,fp8_e4m3 > $R/ab.txt 2>&1
echo "ab rc $?" >> $R/ab.txt
grep -v "Warning\|_set_sync" $R/ab.txt | tail -10
