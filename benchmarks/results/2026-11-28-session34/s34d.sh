#!/usr/bin/env bash
# v99: a unit's fixed cost of 8 KV tiles in the plan (was 13; s34c measured 8 / 13 / 20 on the bf16 128-head batches
# whose plans change). (1) The GPU tests of share plans and multi-wave counts with 8 as the default; (2) 13 / 8 on
# the cases s34c did not cover whose plans change under plan_model.py: fp8 at 128 heads, 64 heads x 2 tokens, the
# grid kernel (pages of 16, where the multi-wave counts apply too), bf16 40 x 2048 x 1; graph replay, flushed L2.
set -uo pipefail
R=$OUT/s34d
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R plan 200 tests/test_triton_decode_gpu.py tests/test_decode_share_plan.py \
  -k "share or waves or few_long or ragged"
tail -n 2 $R/tests-plan.txt
export PYTHONPATH=src:benchmarks/experiments
timeout 250 python benchmarks/experiments/setting_ab.py decode_split_plan.HOPPER_UNIT_COST_TILES c13=13 c8=8 -- \
  128,24,8192,1,fp8_e4m3 128,48,4096,1,fp8_e4m3 128,40,1024,2,fp8_e4m3 128,96,2048,1,fp8_e4m3 \
  128,24,4096,2,fp8_e4m3 64,24,8192,2 64,48,4096,2 64,96,2048,2 64,40,2048,2 128,96,2048,1,bf16,16 \
  128,24,8192,1,bf16,16 128,40,2048,1 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-unit-cost.txt
tail -n 12 $R/ab-unit-cost.txt
