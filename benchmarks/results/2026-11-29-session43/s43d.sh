#!/usr/bin/env bash
# Forty-third session, call 4, carry ["build/dev"] (build/dev/base/src: HEAD 81a9987's src), image's Triton 3.6: v103c
# (v103b with HEAD's whole S issued at the pair's start in units under 48 tiles and in each unit's first pair, instead
# of a left half waited for there). Its GPU test first (three modes, same bits), then HEAD and v103c in alternating
# processes, two rounds, clean L2.
set -uo pipefail
R=$OUT/s43d
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R ahead 240 tests/test_triton_decode_gpu.py -v -k "left_scores_ahead"
grep -c PASSED $R/tests-ahead.txt; grep "FAILED\|rror" $R/tests-ahead.txt | head -20; tail -n 2 $R/tests-ahead.txt
echo "tests $(( $(date +%s) - t0 )) s"
cases="--case 128,64,4096,2 --case 128,64,ragged,2 --case 128,64,1024,2 --case 128,40,8192,2 --case 128,32,4096,4"
timeout $(( 585 - ($(date +%s) - t0) )) benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-v103c.txt 2>&1; echo "rc $?" >> $R/ab-v103c.txt
grep -o "[a-z/]* round [12]: h[0-9]*.*triton *[0-9.]* us" $R/ab-v103c.txt
echo "total $(( $(date +%s) - t0 )) s"
