#!/usr/bin/env bash
# v90: the seesaw asks L2 for its next unit's query rows and first two KV tiles a few tile pairs before this unit's
# end (`hopper_decode.next_unit_prefetch`, `dispatch.L2_PREFETCH_PAIRS`). One call: the seesaw's multi-unit GPU tests
# with the prefetch on (it is a hint: a fault is the only way it could fail them), then an A/B of the setting in one
# process (off, 1, 2, 4 pairs ahead; clean L2, CUDA graphs), then the timeline at 2 pairs on 128h 64 x 1024 q2.
set -uo pipefail
R=$OUT/s28d
mkdir -p $R
timeout -s INT -k 20 170 python -m pytest -q -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "persistent or snake or (share and 128)" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -3 $R/tests.txt
# (As run, this line lacked PYTHONPATH=src and failed; s28d/ab.txt is its re-run with it.)
PYTHONPATH=src timeout 300 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH_PAIRS off=0 p1=1 p2=2 p4=4 -- \
  128,64,1024,2 128,128,4096,1 128,40,4096,2 128,64,ragged,2 128,64,4096,2 128,64,4096,1,fp8_e4m3 16,128,1024,1 \
  > $R/ab.txt 2>&1
echo "ab rc $?" >> $R/ab.txt
grep -v "Warning\|_set_sync" $R/ab.txt | tail -12
PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/seesaw_timeline.py stamp .device/tl > $R/stamp.txt 2>&1
PYTHONPATH=.device/tl/src:benchmarks/experiments:tests timeout 90 python benchmarks/experiments/seesaw_timeline.py \
  run 128,64,1024,2 > $R/timeline.txt 2>&1
grep -h "graph replay\|medians a program\|unit start\|S0 done" $R/timeline.txt
