#!/usr/bin/env bash
# Prepared for the forty-fifth session (not run): v105, benchmarks/experiments/patches/v105-next-pairs-whole-s-behind-
# p1v1.diff, applied to the working tree first (`git apply`), with HEAD's src as build/dev/base/src (refreshed at the
# end of the forty-fourth session; else `rm -rf build/dev/base/src && git archive HEAD src | tar -x -C build/dev/base`;
# `diff -r build/dev/base/src src` before applying the patch shows only mlakit.egg-info; carry ["build/dev"]); image's
# Triton 3.6. v105: the next pair's whole S (its right half and rope too, behind the odd stage's reload) issued in the
# pair before, the first pair's whole S before the loop: no pair starts with S to finish (v103 waited for the first
# pair's left half before the loop, then issued its right half: 0.3-0.6 us later first S a unit, s44a's timeline).
# (1) The GPU tests of the ahead path (both modes the same bits, the reference's attention; the token hint).
# (2) v105 on (from 4 row tiles) and off in one process (setting_ab.py, unhinted plans), as s44a measured v103: compare
#     its on/off ratios with s44a's (64 x 1024 q2: v103 on +3.2%).
# (3) HEAD (v104) and v105 in alternating processes, two rounds, clean L2, on batches where both run ahead (`mlakit
#     bench decode` hints: 1024-token units are off in both).
set -uo pipefail
R=$OUT/s45a
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R ahead 200 tests/test_triton_decode_gpu.py -v -k "left_scores_ahead or token_hint"
tail -n 2 $R/tests-ahead.txt; grep "FAILED\|^E " $R/tests-ahead.txt | head; echo "tests $(( $(date +%s) - t0 )) s"
PYTHONPATH=src:benchmarks/experiments:tests timeout 150 python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.LEFT_SCORES_AHEAD_MIN_ROW_TILES from4=4 never=1000000 -- \
  128,64,1024,2 128,64,2048,2 128,64,4096,2 128,64,ragged,2 > $R/setting-ab.txt 2>&1
echo "rc $?" >> $R/setting-ab.txt; grep -v "Warn\|warn" $R/setting-ab.txt | tail -n 5
echo "setting ab $(( $(date +%s) - t0 )) s"
cases="--case 128,64,4096,2 --case 128,64,ragged,2 --case 128,40,8192,2 --case 128,32,4096,4 --case 128,64,3072,2"
timeout $(( 585 - ($(date +%s) - t0) )) benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-v105.txt 2>&1; echo "rc $?" >> $R/ab-v105.txt
grep -o "[a-z/]* round [12]: h[0-9]*.*triton *[0-9.]* us" $R/ab-v105.txt
echo "total $(( $(date +%s) - t0 )) s"
