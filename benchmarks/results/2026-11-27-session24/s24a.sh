#!/usr/bin/env bash
# Session 24, call a: v83 (the narrow kernel's partials in fp16, in the cache's units) against HEAD. Both trees compile
# first in concurrent processes (pass 0, timings discarded), then each tree in its own `e4m3_scores_ab.py` process,
# two passes in alternating order, each run bounded by the call's remaining time. Outputs bundled into one archive.
set -uo pipefail
mkdir -p $OUT/s24a
R=$OUT/s24a
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt
CASES="16,64,4096,2 16,16,16384,2 16,128,16384,2 16,64,ragged,2 16,64,4096,1 16,64,1024,2"
ab() {
  local tree=$1 name=$2 pass=$3 limit=$4
  PYTHONPATH=$tree:benchmarks/experiments timeout $limit python benchmarks/experiments/e4m3_scores_ab.py \
    --json $R/ab-$name-$pass.json $CASES > $R/ab-$name-$pass.txt 2>&1
  echo "rc $? after ${SECONDS}s" >> $R/ab-$name-$pass.txt
}
ab build/dev/base/src base 0 230 &
ab build/dev/v83/src v83 0 230 &
wait
for run in base,1 v83,1 v83,2 base,2; do
  left=$((575 - SECONDS)); [ $left -lt 60 ] && break
  ab build/dev/${run%,*}/src ${run%,*} ${run#*,} $left
done
tar -C $OUT -czf $OUT/s24a.tgz s24a && rm -rf $R
