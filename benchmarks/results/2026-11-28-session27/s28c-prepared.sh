#!/usr/bin/env bash
# Prepared for the next session (not run): v89 beside FlashMLA in one process, clean L2, where s28b shows a gain (the
# same build/dev trees carried, and build/flashmla-src: carry ["build/dev", "build/flashmla-src"]); FlashMLA built
# first (~125 s). The 128-head batches issue 23 names (64 x 1024, 128 x 1024, 64 x 4096 at one and two tokens, ragged)
# and the share batches; ratios against the anchors of 2026-11-27 / stop 57 are a guide only, these are the proof.
set -uo pipefail
R=$OUT/s28c
mkdir -p $R
MLAKIT_SRC=build/dev/v89/src benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 560 \
  "grid128=128,64,1024,1 128,64,1024,2 128,128,1024,1 128,128,1024,2 128,64,4096,1 128,64,4096,2 128,64,ragged,1 128,64,ragged,2" \
  "shares128=128,40,4096,2 128,40,8192,2 128,24,16384,1 128,24,16384,2"
