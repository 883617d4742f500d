#!/usr/bin/env bash
# Prepared for the next session (not run): why a program's first unit runs its tile loop slower than its later one
# (s27d / s28d timelines, 128h 64 x 1024 q2: 31.0 against 26.5 us for the same 16 tiles; 128 x 4096 q1: 125.2
# against 120.0 us for 64: about 5 us once, not a rate). The same timeline after a flush (as before) and right after
# another call without one (`--warm`: L2 holds that call's lines, the code has just run): if the first unit's extra
# ~5 us goes away warm, it is the cold start (caches, TLB), which a model's layers do not pay each step the way
# the benchmark's flushed replays do; if it stays, it is the start-up burst of every program's Q and first tiles.
set -uo pipefail
R=$OUT/s29c
mkdir -p $R
PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/seesaw_timeline.py stamp .device/tl > $R/stamp.txt 2>&1
for mode in "" --warm; do
  PYTHONPATH=.device/tl/src:benchmarks/experiments:tests timeout 120 python benchmarks/experiments/seesaw_timeline.py \
    run $mode 128,64,1024,2 128,128,4096,1 >> $R/timeline.txt 2>&1
done
grep -h "graph replay\|medians a program" $R/timeline.txt
