#!/usr/bin/env bash
# Prepared for the next session (not run): where a unit's fixed cost (~13 KV tiles, ~20 us; NOTES.md v87, v88, "Next
# (issue 23)" (2)) goes, from the seesaw's in-kernel timeline (`seesaw_timeline.py`: prologue, wait to the first
# scores, tile loop, stores, per unit) on batches whose programs run two or three units: 128h 64 x 1024 x 2 tokens
# (two units a program, the grid's worst case beside FlashMLA), 40 x 4096 x 2 with equal shares (three rounds of
# pieces), 128 x 4096 x 1 (two units). The unit's parts that do not scale with its tiles are what a pipeline across
# units could hide.
set -uo pipefail
R=$OUT/s27b
mkdir -p $R
rm -rf .device/tl
PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/seesaw_timeline.py stamp .device/tl > $R/stamp.txt 2>&1
PYTHONPATH=.device/tl/src:benchmarks/experiments:tests timeout 250 python benchmarks/experiments/seesaw_timeline.py run \
  128,64,1024,2 128,128,4096,1 > $R/timeline-v87-plans.txt 2>&1
echo "rc $?" >> $R/timeline-v87-plans.txt
PYTHONPATH=.device/tl/src:benchmarks/experiments:tests timeout 200 python -c "
import runpy, sys
from mlakit.kernels import decode_split_plan
decode_split_plan.EQUAL_SHARES = True
sys.argv = ['seesaw_timeline.py', 'run', '128,40,4096,2', '128,40,8192,2']
runpy.run_path('benchmarks/experiments/seesaw_timeline.py', run_name='__main__')
" > $R/timeline-shares.txt 2>&1
echo "rc $?" >> $R/timeline-shares.txt
grep -h "graph replay\|medians a program" $R/timeline-*.txt
