#!/usr/bin/env bash
# Session 27, call 3 (equal shares on by default): the demo on the GPU; the seesaw's timeline where a program runs two
# or three units (s27b-prepared.sh of session 26, the share cases now planned by default); the in-kernel merge
# ceiling A/B on the one-token share plans (split ceiling 9: the combine kernel merges them at MERGE_MAX_SPLITS 4).
set -uo pipefail
R=$OUT/s27d
mkdir -p $R
PYTHONPATH=src timeout 100 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -4 $R/demo-gpu.txt
rm -rf .device/tl
PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/seesaw_timeline.py stamp .device/tl > $R/stamp.txt 2>&1
PYTHONPATH=.device/tl/src:benchmarks/experiments:tests timeout 200 python benchmarks/experiments/seesaw_timeline.py run \
  128,64,1024,2 128,128,4096,1 128,40,4096,2 128,40,8192,2 > $R/timeline.txt 2>&1
echo "rc $?" >> $R/timeline.txt
grep -h "graph replay\|medians a program\|^rc" $R/timeline.txt
PYTHONPATH=src:benchmarks/experiments timeout $((540 - SECONDS)) python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.MERGE_MAX_SPLITS m4=4 m9=9 -- 128,24,16384,1 128,24,16384,1,fp8_e4m3 128,24,~16384,1 \
  > $R/merge-ceiling-ab.txt 2>&1
echo "rc $?" >> $R/merge-ceiling-ab.txt
tail -12 $R/merge-ceiling-ab.txt
