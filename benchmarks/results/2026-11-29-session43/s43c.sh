#!/usr/bin/env bash
# Forty-third session, call 3, carry ["build/dev"] (build/dev/base/src: HEAD 81a9987's src), image's Triton 3.6: v103b
# (16-bit pages, 128 heads at q_len >= 2: the left half of S ahead only in units of at least 48 KV tiles, a runtime
# test per unit). Its GPU test first (three modes, same bits), then HEAD and v103b in alternating processes, two
# rounds, clean L2.
set -uo pipefail
R=$OUT/s43c
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R ahead 240 tests/test_triton_decode_gpu.py -v -k "left_scores_ahead"
grep -c PASSED $R/tests-ahead.txt; grep "FAILED\|rror" $R/tests-ahead.txt | head -20; tail -n 2 $R/tests-ahead.txt
echo "tests $(( $(date +%s) - t0 )) s"
cases="--case 128,64,4096,2 --case 128,64,ragged,2 --case 128,64,1024,2 --case 128,40,8192,2 --case 128,32,4096,4"
timeout $(( 585 - ($(date +%s) - t0) )) benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-v103b.txt 2>&1; echo "rc $?" >> $R/ab-v103b.txt
grep -o "[a-z/]* round [12]: h[0-9]*.*triton *[0-9.]* us" $R/ab-v103b.txt
echo "total $(( $(date +%s) - t0 )) s"
