#!/usr/bin/env bash
# The seesaw's in-kernel timeline (seesaw_timeline.py: globaltimer stamps in a copy of the package) on the ragged q2
# batch's share plan and on the uniform 64 x 16384 q2 batch, 3.6: what a unit change costs on the H200 now (NOTES
# "Fortieth session": ragged q2 runs 7% slower a tile than the uniform batch, FlashMLA 1.6%).
set -uo pipefail
R=$OUT/s40g
mkdir -p $R
python benchmarks/experiments/seesaw_timeline.py stamp /tmp/tl > /dev/null
PYTHONPATH=/tmp/tl/src:tests timeout 150 python benchmarks/experiments/seesaw_timeline.py run 128,64,ragged,2 \
  128,64,16384,2 2>&1 | grep -v "Warn\|_sync_debug" > $R/timeline.txt
tail -n 30 $R/timeline.txt
