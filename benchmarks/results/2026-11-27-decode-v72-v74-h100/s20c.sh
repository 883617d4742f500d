#!/usr/bin/env bash
# Session 20, call 3: where a unit's fixed cost goes at 128h long q2 (timeline with per-program merge / in-unit /
# whole-loop totals; build/dev/tl20 = HEAD c6d3818 stamped + accumulators), and the in-kernel merge against the
# combine kernel (HEAD's src, build/dev/head20).
# carry: build/dev/s20c.sh build/dev/tl20 build/dev/head20
cd "$(dirname "$0")/../.."
root=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
cd build/dev/tl20/experiments
PYTHONPATH=$root/build/dev/tl20/src:$root/build/dev/head20/tests timeout 240 python seesaw_timeline.py run \
  128,64,16384,2 128,64,4096,2 128,128,16384,2 128,64,ragged,2 128,64,ragged,1 128,64,1024,1 2>&1 | tee $OUT/timeline.txt
PYTHONPATH=$root/build/dev/head20/src:$root/build/dev/head20/tests timeout 200 python merge_in_kernel.py --variants=default,combine \
  128,64,16384,2 128,128,16384,2 128,64,ragged,1 128,64,ragged,2 2>&1 | tee $OUT/merge.txt
