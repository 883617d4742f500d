#!/usr/bin/env bash
# uneven batches (lengths within 20% of N, `--case H,B,~N,Q`, not ragged for
# the split plan) beside FlashMLA in one process, clean L2; the model in NOTES.md "Next (issue 23)" (4) puts 128 heads
# at ~1.2x the even share there. Carry build/flashmla-src (beside_flashmla.sh builds FlashMLA first, ~125 s).
set -uo pipefail
benchmarks/experiments/beside_flashmla.sh $OUT/s26c build/flashmla-src 570 \
  "uneven128=128,32,~16384,2 128,64,~4096,2 128,64,~4096,1 128,128,~4096,1 128,64,~16384,1" \
  "uneven16=16,64,~4096,1 16,64,~4096,2 16,128,~16384,2"
