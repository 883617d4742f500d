#!/usr/bin/env bash
# Prepared for the next session (not run: this session's device time was spent; no carry). v99 landed at a unit cost
# of 9 KV tiles; the A/B ran 8 against 13. (1) The four kv-range decode GPU tests no call reached on v98 / v99, and
# the plan tests at 9. (2) HOPPER_UNIT_COST_TILES 9 / 8 / 13 on the batches where those plans differ and no run
# measured them (plan_model.py, 132 SMs): 8 drops the shares 24 x 16384 x 2 and 48 x 16384 x 1 take at 9 and 13;
# 40 x 1024 x 2 and 80 x 1024 x 1 take shares only at 8; 56 x 8192 x 1, 12 x 8192 x 2, 56 x 4096 x 2 and 80 x 2048
# x 2 take them at 8 and 9, not at 13. Graph replay, flushed L2, one process.
set -uo pipefail
R=$OUT/s35a
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R plan 220 tests/test_triton_decode_gpu.py tests/test_decode_share_plan.py \
  -k "kv_range or share or waves or few_long"
tail -n 2 $R/tests-plan.txt
export PYTHONPATH=src:benchmarks/experiments
timeout 330 python benchmarks/experiments/setting_ab.py decode_split_plan.HOPPER_UNIT_COST_TILES c9=9 c8=8 c13=13 -- \
  128,24,16384,2 128,24,16384,2,fp8_e4m3 128,48,16384,1 128,40,1024,2 128,40,1024,2,fp8_e4m3 128,80,1024,1 \
  128,56,8192,1 128,12,8192,2 128,56,4096,2 128,80,2048,2 64,48,16384,2 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/ab-unit-cost.txt
tail -n 11 $R/ab-unit-cost.txt
