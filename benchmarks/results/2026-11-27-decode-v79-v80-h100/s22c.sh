#!/usr/bin/env bash
# Session 22, call c: what the seesaw's merge code costs where nothing merges (MERGE off: HEAD with MERGE_MAX_SPLITS 1,
# the combine kernel launched behind it and finding one split per sequence).
set -uo pipefail
timeout 300 benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src build/dev/nomerge/src -- \
  --case 128,64,4096,1,bf16,64 --case 128,64,4096,2,bf16,64 --case 128,64,16384,2,bf16,64 \
  --case 128,64,1024,1,bf16,64 --case 128,16,4096,2,bf16,64 \
  --backends triton --no-baseline --clean-l2 > $OUT/ab-merge-off.txt 2>&1
echo "ab rc $?" >> $OUT/ab-merge-off.txt
