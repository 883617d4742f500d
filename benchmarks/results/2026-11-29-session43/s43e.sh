#!/usr/bin/env bash
# Forty-third session, last call, no carry, image's Triton 3.6, on the landed form (v103 as s43b measured it, fp8 pages
# now left out: their SASS is HEAD's): its GPU test (both modes, same bits), the GPU demo, then the Hopper-kernel grid
# and the 128-head kv-format tests for what time is left.
set -uo pipefail
R=$OUT/s43e
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R ahead 120 tests/test_triton_decode_gpu.py -v -k "left_scores_ahead"
tail -n 2 $R/tests-ahead.txt; echo "tests $(( $(date +%s) - t0 )) s"
PYTHONPATH=src timeout 110 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 3 $R/demo-gpu.txt; echo "demo $(( $(date +%s) - t0 )) s"
benchmarks/experiments/gpu_test_shard.sh $R hopper $(( 350 - ($(date +%s) - t0) )) tests/test_triton_decode_gpu.py -v \
  -k "hopper_kernel_matches or 128_heads_with_every"
grep -c PASSED $R/tests-hopper.txt; grep "FAILED\|rror" $R/tests-hopper.txt | head; tail -n 2 $R/tests-hopper.txt
echo "total $(( $(date +%s) - t0 )) s"
