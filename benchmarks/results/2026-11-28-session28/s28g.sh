#!/usr/bin/env bash
# Probe (not a kernel version): equal shares forced wherever they fit (build/dev/shares: HEAD's plan kernel with the
# share estimate's gain test removed) against HEAD (build/dev/base), alternating processes, clean L2. The unit cost
# the plan charges (13 tiles) was fitted on lockstep batches, where every program changes units at once (an HBM
# burst, NOTES.md v89 / v90); a share plan's programs change units at different tiles. If the model's +8-22% for
# shares on these batches does not show, the cost is the burst's, not the unit's.
# Host: rm -rf build/dev && mkdir -p build/dev/base build/dev/shares; git archive HEAD src | tar -x -C each; in
# build/dev/shares/src/mlakit/kernels/decode_split_plan.py drop the `& (span * MULTI_WAVE_MIN_GAIN_DEN < ...)` term.
set -uo pipefail
R=$OUT/s28g
mkdir -p $R
timeout 400 benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src build/dev/shares/src -- \
  --case 128,64,1024,2,bf16,64 --case 128,128,4096,1,bf16,64 --case 128,64,4096,2,bf16,64 \
  --case 128,64,4096,1,fp8_e4m3,64 --backends triton --no-baseline --clean-l2 > $R/ab-shares.txt 2>&1
echo "ab rc $?" >> $R/ab-shares.txt
grep -v "Warning\|_set_sync" $R/ab-shares.txt | cut -c1-120
