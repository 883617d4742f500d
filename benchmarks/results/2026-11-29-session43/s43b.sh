#!/usr/bin/env bash
# Forty-third session, call 2, carry ["build/dev"] (build/dev/base/src: HEAD 81a9987's src), image's Triton 3.6: v103
# gated (LEFT_SCORES_AHEAD from 4 row tiles a sequence on: 128 heads at q_len >= 2). Its GPU test (both modes, same
# bits) and the Hopper-kernel grid, then HEAD and v103 in alternating processes, three rounds, clean L2, on the
# batches it changes (q_len 2 and 4 at 128 heads, bf16 and fp8).
set -uo pipefail
R=$OUT/s43b
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R ahead 230 tests/test_triton_decode_gpu.py \
  -k "left_scores_ahead or hopper_kernel_matches or 128_heads_with_every or heads_and_draft_lengths and 128"
grep -c PASSED $R/tests-ahead.txt; grep "FAILED\|rror" $R/tests-ahead.txt | head -20; tail -n 2 $R/tests-ahead.txt
echo "tests $(( $(date +%s) - t0 )) s"
cases="--case 128,64,4096,2 --case 128,64,ragged,2 --case 128,64,1024,2 --case 128,40,8192,2 --case 128,32,4096,4
  --case 128,64,4096,2,fp8_e4m3 --case 128,64,ragged,2,fp8_e4m3"
timeout $(( 585 - ($(date +%s) - t0) )) benchmarks/experiments/ab_source_trees.sh 3 build/dev/base/src src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-v103-gated.txt 2>&1; echo "rc $?" >> $R/ab-v103-gated.txt
grep -o "[a-z/]* round [123]: h[0-9]*.*triton *[0-9.]* us" $R/ab-v103-gated.txt
echo "total $(( $(date +%s) - t0 )) s"
