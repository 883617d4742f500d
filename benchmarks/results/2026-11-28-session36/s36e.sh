#!/usr/bin/env bash
# After the rule moved into mlakit/kernels/seesaw_layout.py (the Hopper kernels' BLOCK_N, TMA_CHUNK and
# DEEPSEEK_WIDTHS now built from its plain ints): a smoke run of seesaw / narrow decode tests and the serving ones.
set -uo pipefail
R=$OUT/s36e
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R smoke 170 tests/test_triton_decode_gpu.py tests/test_forward.py \
  -k "equal_share_plans_at_128_heads or kv_range_from_the_plan or forward"
tail -n 2 $R/tests-smoke.txt
grep -h "^FAILED\|^ERROR" $R/tests-smoke.txt | head
