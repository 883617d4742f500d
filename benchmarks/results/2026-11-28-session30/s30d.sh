#!/usr/bin/env bash
# The rest of issue 23's standing on this session's H200: 16 heads and 128-head q1 batches beside FlashMLA 9241ae3
# (one process, clean L2), and fp8 at 16 heads against bf16 (e4m3_scores_ab.py: default, e4m3 scores, hinted).
# Carry ["build/flashmla-src"].
set -uo pipefail
R=$OUT/s30d
mkdir -p $R
timeout 330 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 320 \
  "h16=16,64,4096,1 16,64,4096,2 16,16,4096,1 16,128,1024,2 16,64,ragged,1 16,64,ragged,2" \
  "h128q1=128,64,4096,1 128,128,4096,1 128,64,1024,1 128,16,16384,1 128,1,16384,1"
PYTHONPATH=src:benchmarks/experiments timeout 170 python benchmarks/experiments/e4m3_scores_ab.py \
  --json $R/fp8-h16.json 16,64,4096,2 16,128,4096,2 16,64,4096,1 > $R/fp8-h16.txt 2>&1
echo "rc $?" >> $R/fp8-h16.txt
for f in h16 h128q1; do grep -E "MISSED|met " $R/$f.txt; done
grep -v "Warn\|_sync_debug" $R/fp8-h16.txt | tail -n 8
