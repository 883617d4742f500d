#!/usr/bin/env bash
# Why the 16-head fp8 q2 path (narrow kernel, e4m3 scores, 32-row tile from the hint) moves ~2.4 TB/s of cache on the
# H200 where bf16 moves 3.5: ncu --set full of one call at 16 x 64 x 4096 x 2 tokens, the SASS source page with its
# warp-stall samples (summarized on the host by ncu_sass_stalls.py) and the details page.
set -uo pipefail
R=$OUT/s30g
mkdir -p $R
PYTHONPATH=src:benchmarks/experiments timeout 200 ncu --kernel-name regex:narrow --launch-skip 1 --launch-count 1 \
  --set full --clock-control none --import-source no -o /tmp/narrow python benchmarks/experiments/hopper_profile_case.py \
  --e4m3-scores --hinted 16,64,4096,2,fp8_e4m3 > $R/ncu-run.txt 2>&1
tail -n 5 $R/ncu-run.txt
ncu --import /tmp/narrow.ncu-rep --page details > $R/details.txt 2>&1
ncu --import /tmp/narrow.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $R/sass.csv.gz
grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Shared Memory Configuration Size|Block Limit" $R/details.txt | head -20
