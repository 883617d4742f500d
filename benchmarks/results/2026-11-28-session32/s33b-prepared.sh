#!/usr/bin/env bash
# Prepared for the next session (not run), after s33a-prepared.sh and only if v97 holds there: the ragged batches
# beside FlashMLA 9241ae3 in one process (clean L2) with v97's patch applied (carry ["build/flashmla-src"]), with
# the 128-head cases v96 moved and 16h ragged as controls.
set -uo pipefail
R=$OUT/s33b
mkdir -p $R
timeout 420 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 410 \
  "h128=128,64,ragged,1 128,64,ragged,2 128,40,4096,2 128,64,4096,2 128,64,1024,2" "h16=16,64,ragged,1 16,64,ragged,2"
for f in h128 h16; do grep " us " $R/$f.txt | cut -c1-120; done
