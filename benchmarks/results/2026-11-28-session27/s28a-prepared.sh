#!/usr/bin/env bash
# Prepared for the next session (not run): v89, the seesaw loading the next unit's first two tiles under this unit's
# last pair (patches/v89-seesaw-next-unit-tiles-under-last-pair.diff; NOTES.md "v89 (prepared, not run)").
# On the host first (build/ is ignored; carry build/dev in the device call):
#   rm -rf build/dev && mkdir -p build/dev/base build/dev/v89
#   git archive HEAD src | tar -x -C build/dev/base && git archive HEAD src benchmarks/experiments | tar -x -C build/dev/v89
#   git apply --directory=build/dev/v89 benchmarks/experiments/patches/v89-seesaw-next-unit-tiles-under-last-pair.diff
# Then: (1) v89's GPU decode tests over the seesaw's several units a program (persistent plans, shares, waves, ranges,
# graphs, the Hopper kernel against the reference), one process; (2) A/B against HEAD in alternating processes, clean
# L2 (the prediction: 128h 64 x 1024 q2 -3%, 128 x 4096 q1 -1%, 40 x 4096 q2 with shares -3%, ragged level: no
# prefetch there, 16h bf16 -2 to -4%); (3) v89's timeline on 64 x 1024 q2 (the later unit's "to S0" should drop).
set -uo pipefail
R=$OUT/s28a
mkdir -p $R
PYTHONPATH=build/dev/v89/src timeout -s INT -k 20 280 python -m pytest -q -rf -p no:cacheprovider -m gpu \
  tests/test_triton_decode_gpu.py -k "persistent or share or waves or kv_range or graph or hopper_kernel_matches or seesaw or 128_heads" \
  > $R/tests-v89.txt 2>&1
echo "rc $?" >> $R/tests-v89.txt
tail -3 $R/tests-v89.txt
timeout 330 benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src build/dev/v89/src -- \
  --case 128,64,1024,2,bf16,64 --case 128,128,4096,1,bf16,64 --case 128,40,4096,2,bf16,64 \
  --case 128,64,ragged,2,bf16,64 --case 16,128,1024,1,bf16,64 --case 128,64,4096,1,fp8,64 \
  --backends triton --no-baseline --clean-l2 > $R/ab-v89.txt 2>&1
echo "ab rc $?" >> $R/ab-v89.txt
cat $R/ab-v89.txt
cd build/dev/v89  # v89's tree with its timeline tool's anchors
PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/seesaw_timeline.py stamp .device/tl > $R/stamp.txt 2>&1
PYTHONPATH=.device/tl/src:benchmarks/experiments:../../../tests timeout 120 python benchmarks/experiments/seesaw_timeline.py \
  run 128,64,1024,2 > $R/timeline-v89.txt 2>&1
grep -h "graph replay\|medians a program" $R/timeline-v89.txt
