#!/usr/bin/env bash
# v99 beside FlashMLA 9241ae3 in one process (clean L2; carry ["build/flashmla-src"]): the 128-head batches whose
# plans v99 changed (share plans at a unit cost of 8), in two groups so that a group the budget cuts keeps the other.
set -uo pipefail
R=$OUT/s34e
mkdir -p $R
timeout 290 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 280 \
  "a=128,40,1024,2 128,24,4096,2" "b=128,40,2048,1 128,24,8192,1"
for f in a b; do grep " us " $R/$f.txt | cut -c1-120; done
