#!/usr/bin/env bash
# Session 27, call 5: fixed split counts now planned by the plan kernel (`forced_splits`; the host path's torch copy of
# its range rule removed): the GPU decode tests over forced / fixed counts, plans reused for other lengths, the
# persistent kernel's counters, the multi-wave plans, graphs and the kernels reading their plan's ranges (one process,
# equal shares on by default); then the plan kernel's own time with shares off / on.
set -uo pipefail
R=$OUT/s27f
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R plans 270 tests/test_triton_decode_gpu.py \
  -k "forced_split or fixed_splits or kv_range or persistent or waves or graph"
grep -E "passed|failed|^rc |FAILED|Interrupt" $R/tests-plans.txt | tail -6
PYTHONPATH=src:benchmarks/experiments timeout $((400 - SECONDS)) python benchmarks/experiments/plan_kernel_time.py \
  128,40,8192,2 128,24,16384,1 128,40,4096,2 128,64,4096,2 128,128,4096,1 16,64,4096,1 128,64,ragged,2 \
  > $R/plan-kernel-time.txt 2>&1
echo "rc $?" >> $R/plan-kernel-time.txt
cat $R/plan-kernel-time.txt | grep -v Warning | tail -10
