#!/usr/bin/env bash
# Prepared for the next session (not run): where issue 23's 128-head targets stand after v88-v90b, in one call.
# (1) bf16 beside FlashMLA 9241ae3 in one process, clean L2 (beside_flashmla.sh builds it first, ~140 s): the long q2
# batches, the ragged batch and the odd batches that missed 1.0x last time (NOTES "Next (issue 23)").
# (2) fp8 at 128 heads against our bf16 on batches of >= 64k tokens (the 0.95x target): e4m3_scores_ab.py (bf16, fp8
# default, e4m3 scores, hinted; clean and dirty L2; ceilings in the same run).
# Carry ["build/flashmla-src"] (FlashMLA 9241ae3 with cutlass 147f5673's headers, ~30 MB; beside_flashmla.sh's header
# says how to rebuild it if missing).
set -uo pipefail
R=$OUT/s30a
mkdir -p $R
timeout 360 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 350 \
  "q2=128,64,4096,2 128,128,4096,2 128,64,16384,2 128,64,1024,2" \
  "ragged=128,64,ragged,1 128,64,ragged,2" \
  "odd=128,24,16384,2 128,40,8192,2 128,40,4096,2"
PYTHONPATH=src:benchmarks/experiments timeout 200 python benchmarks/experiments/e4m3_scores_ab.py \
  --json $R/fp8-h128.json 128,64,4096,1 128,64,4096,2 128,128,4096,1 > $R/fp8-h128.txt 2>&1
echo "rc $?" >> $R/fp8-h128.txt
grep -v "Warn\|_sync_debug" $R/fp8-h128.txt | tail -n 20
