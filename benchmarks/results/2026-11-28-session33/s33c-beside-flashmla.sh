#!/usr/bin/env bash
# v97 with the page-size hint (s33b): the ragged batches beside FlashMLA 9241ae3 in one process (clean L2; carry
# ["build/flashmla-src"]), with the 128-head cases v96 moved and 16h ragged as controls.
set -uo pipefail
R=$OUT/s33c
mkdir -p $R
timeout 400 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 390 \
  "h128=128,64,ragged,1 128,64,ragged,2 128,40,4096,2 128,64,4096,2 128,64,1024,2" "h16=16,64,ragged,1 16,64,ragged,2"
for f in h128 h16; do grep " us " $R/$f.txt | cut -c1-120; done
# Then, while the call's time lasts: the share-only combine's program size (SHARE_COMBINE_ROWS 8 / 16 / 32 rows, as
# many warps) on share plans and on plans where it finds nothing (graph replay, flushed L2).
export PYTHONPATH=src:benchmarks/experiments
timeout 170 python benchmarks/experiments/setting_ab.py triton_decode.SHARE_COMBINE_ROWS r8=8 r16=16 r32=32 -- \
  128,40,4096,2 128,40,8192,2 128,64,1024,2 128,128,1024,1 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/ab-share-combine-rows.txt
tail -n 4 $R/ab-share-combine-rows.txt
