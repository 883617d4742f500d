#!/usr/bin/env bash
# Prepared for the next session (not run), after s32a-prepared.sh and only if its MERGE_MAX_SPLITS 8 row gains at 16
# heads: the 16-head ragged batch and 64 x 4096 beside FlashMLA 9241ae3 in one process (clean L2), main and a tree with
# MERGE_MAX_SPLITS = 8 (build/dev/m8), so that the ratio to FlashMLA is measured, not inferred from the A/B.
# Host, before the call:
#   mkdir -p build/dev/m8 && git archive HEAD src | tar -x -C build/dev/m8 &&
#   sed -i 's/^MERGE_MAX_SPLITS = 4$/MERGE_MAX_SPLITS = 8/' build/dev/m8/src/mlakit/kernels/hopper_decode/dispatch.py &&
#   grep -q '^MERGE_MAX_SPLITS = 8$' build/dev/m8/src/mlakit/kernels/hopper_decode/dispatch.py
# Carry ["build/flashmla-src", "build/dev"].
set -uo pipefail
R=$OUT/s32b
mkdir -p $R
CASES="16,64,ragged,1 16,64,ragged,2 16,64,4096,1 16,64,4096,2 16,128,1024,2"
timeout 300 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 290 "main=$CASES"
MLAKIT_SRC=build/dev/m8/src timeout 250 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 240 "m8=$CASES"
for f in main m8; do grep " us " $R/$f.txt | cut -c1-60; done
