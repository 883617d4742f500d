#!/usr/bin/env bash
# (1) The decode GPU tests s34b's shard did not reach (e4m3, persistent kernel, prefetch, kv ranges, several waves).
# (2) v87's unit cost (13 KV tiles, fitted on the H100 in session 25) re-tried on the H200: the cases whose plans
# differ between 8, 13 and 20 under plan_model.py (CPU, 132 SMs); graph replay, flushed L2, one process.
set -uo pipefail
R=$OUT/s34c
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R decode-rest 300 tests/test_triton_decode_gpu.py \
  -k "e4m3 or persistent or prefetch or kv_range or few_long or wide_narrow or triton_fp8_backend"
tail -n 2 $R/tests-decode-rest.txt
export PYTHONPATH=src:benchmarks/experiments
timeout 220 python benchmarks/experiments/setting_ab.py decode_split_plan.HOPPER_UNIT_COST_TILES c13=13 c8=8 c20=20 -- \
  128,24,8192,1 128,48,4096,1 128,48,8192,1 128,96,2048,1 128,40,4096,1 128,24,4096,2 128,24,8192,2 \
  128,40,1024,2 128,40,2048,2 128,48,2048,2 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-unit-cost.txt
tail -n 11 $R/ab-unit-cost.txt
