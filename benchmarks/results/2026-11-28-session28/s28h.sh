#!/usr/bin/env bash
# v90 on the e4m3-scores path (fp8 pages, S on 8-bit tensor cores, opt-in): the next unit's L2 prefetch never / one
# pair ahead, one process, clean L2, graphs; and the default fp8 path's ragged batch (no prefetch there: level).
set -uo pipefail
R=$OUT/s28h
mkdir -p $R
export PYTHONPATH=src
timeout 300 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH_PAIRS off=0 p1=1 -- \
  --e4m3-scores 128,64,4096,1,fp8_e4m3 128,128,4096,1,fp8_e4m3 128,64,4096,2,fp8_e4m3 128,40,4096,2,fp8_e4m3 \
  128,64,1024,2,fp8_e4m3 > $R/ab-e4m3.txt 2>&1
echo "ab rc $?" >> $R/ab-e4m3.txt
timeout 150 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH_PAIRS off=0 p1=1 -- \
  128,64,ragged,2,fp8_e4m3 128,64,1024,2,fp8_e4m3 > $R/ab-fp8.txt 2>&1
echo "ab rc $?" >> $R/ab-fp8.txt
grep -h " us (\|rc" $R/ab-e4m3.txt $R/ab-fp8.txt
