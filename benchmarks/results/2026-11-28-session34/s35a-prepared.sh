#!/usr/bin/env bash
# Prepared for the next session (not run: this session's device time was spent). v100 as an experiment: the multi-wave
# estimate's own unit cost (WAVES_UNIT_COST_TILES, 13) beside the share estimate's (HOPPER_UNIT_COST_TILES, 8 since
# v99). Before the call, on the host: git apply benchmarks/experiments/patches/v100-waves-unit-cost.diff (on bd76faf
# or later; no carry); after it, git checkout src/mlakit/kernels/decode_split_plan.py unless v100 is kept. Under
# plan_model.py (CPU, 132 SMs) it changes 39 of 288 batches (128 / 64 heads, q 1 / 2, 8-128 x 1024-32768): the
# two-wave counts v99 took where they lost 1-2.4% (96 x 2048 x 1, 48 x 2048 x 2) go back to one wave or take shares,
# and many part-filled waves take shares (24 x 4096 x 1, 40 x 1024 x 1, 96 x 4096 x 1, 48 x 4096 x 2, 96 x 1024 x 2,
# ...). w8 = HEAD's plans, w13 = v100's; graph replay, flushed L2, one process. Keep v100 only if no case loses.
set -uo pipefail
R=$OUT/s35a
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R plan 200 tests/test_triton_decode_gpu.py tests/test_decode_share_plan.py \
  -k "share or waves or few_long or ragged"
tail -n 2 $R/tests-plan.txt
export PYTHONPATH=src:benchmarks/experiments
timeout 300 python benchmarks/experiments/setting_ab.py decode_split_plan.WAVES_UNIT_COST_TILES w8=8 w13=13 -- \
  128,24,4096,1 128,40,1024,1 128,48,2048,1 128,56,4096,1 128,96,2048,1 128,96,4096,1 128,12,4096,2 \
  128,48,2048,2 128,48,4096,2 128,80,1024,2 128,96,2048,2 64,96,2048,2 128,96,2048,1,fp8_e4m3 128,64,4096,2 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-waves-unit-cost.txt
tail -n 14 $R/ab-waves-unit-cost.txt
