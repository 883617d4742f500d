#!/usr/bin/env bash
# Where 3.8.0's time differs from 3.6's, kernel by kernel (carry ["build/triton38"]): kernel_spans.py (device
# timestamps, L2 flushed, medians of 20 calls, the plan built outside the call) on the ragged 128h q2 share batch
# (3.8 -1.4 to -4.8%) and 64 x 1024 q1 (3.8 +6.1%), under 3.6 and 3.8.0 in alternating processes, two rounds.
# The helper's SASS comparison found the seesaw's code within 1% across the versions (seesaw-sass-t36-t371-t38.txt).
set -uo pipefail
R=$OUT/s41g
mkdir -p $R /tmp/cache38
source benchmarks/experiments/with_packed_triton.sh build/triton38
for round in 1 2; do
  for tree in src $PACKED_TRITON:src; do
    label=t36; [ "$tree" = src ] || label=t38
    TRITON_CACHE_DIR=/tmp/cache38 PYTHONPATH=$tree:benchmarks/experiments timeout 100 python \
      benchmarks/experiments/kernel_spans.py hopper_decode.dispatch.L2_PREFETCH_PAIRS_16BIT as-is=0 -- \
      128,64,ragged,2 128,64,1024,1 2>&1 | grep " us" | sed "s|^|$label r$round |" >> $R/spans.txt
  done
done
cut -c1-220 $R/spans.txt
