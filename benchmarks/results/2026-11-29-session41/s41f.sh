#!/usr/bin/env bash
# The batches of 1024-token sequences (and two q1 / 16-head controls) under the image's Triton 3.6 and under 3.8.0
# (packed; carry ["build/triton38"]) in alternating processes, two rounds, clean L2: s41e beside FlashMLA put 3.8 5-7%
# behind 3.6 there (normalized by FlashMLA across sessions), where s41b / s41c had no such case.
set -uo pipefail
R=$OUT/s41f
mkdir -p $R /tmp/cache38
source benchmarks/experiments/with_packed_triton.sh build/triton38
cases="--case 128,64,1024,1 --case 128,64,1024,2 --case 16,128,1024,2 --case 16,16,1024,2 --case 16,16,4096,1
  --case 128,128,4096,1"
TRITON_CACHE_DIR=/tmp/cache38 timeout 400 benchmarks/experiments/ab_source_trees.sh 2 src $PACKED_TRITON:src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-t36-t38.txt 2>&1; echo "rc $?" >> $R/ab-t36-t38.txt
grep -v "Warn\|_sync_debug" $R/ab-t36-t38.txt | cut -c1-110
