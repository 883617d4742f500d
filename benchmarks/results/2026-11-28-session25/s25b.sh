#!/usr/bin/env bash
# Run in the twenty-fifth session: batches of odd sizes, where v84 / v84b changed the split plan (24, 48, 100
# sequences), beside FlashMLA in one process, clean L2 (benchmarks/experiments/beside_flashmla.sh builds FlashMLA
# first, ~140 s). Carry build/flashmla-src (FlashMLA 9241ae3 with cutlass 147f5673's headers, ~30 MB; see
# beside_flashmla.sh's header to rebuild it if missing).
set -uo pipefail
benchmarks/experiments/beside_flashmla.sh $OUT/s25b build/flashmla-src 570 \
  "odd128=128,24,4096,1 128,24,4096,2 128,48,4096,1 128,24,16384,2" \
  "odd16=16,48,4096,1 16,48,4096,2 16,100,4096,1 16,48,16384,2 16,24,8192,2"
