#!/usr/bin/env bash
# Forty-third session, call 1, carry ["build/dev"] (build/dev/base/src: HEAD 81a9987's src), image's Triton 3.6: v103
# (warpgroup 0 issues the next pair's left half of S behind its P1 . V1_L, retires P1 . V1_L with S still in flight,
# reloads, then waits for S) against HEAD. The decode GPU tests on v103 (time-limited), then HEAD and v103 in
# alternating processes, two rounds, clean L2.
set -uo pipefail
R=$OUT/s43a
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R decode 250 tests/test_triton_decode_gpu.py tests/test_decode_share_plan.py
tail -n 3 $R/tests-decode.txt; grep -c PASSED $R/tests-decode.txt; grep "FAILED\|Error" $R/tests-decode.txt | head -20
echo "tests $(( $(date +%s) - t0 )) s"
cases="--case 128,64,4096,1 --case 128,64,4096,2 --case 128,64,ragged,2 --case 128,64,1024,1 --case 16,64,4096,2"
timeout $(( 580 - ($(date +%s) - t0) )) benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-v103.txt 2>&1; echo "rc $?" >> $R/ab-v103.txt
grep -o "[a-z/]* round [12]: h[0-9]*.*triton *[0-9.]* us" $R/ab-v103.txt
echo "total $(( $(date +%s) - t0 )) s"
