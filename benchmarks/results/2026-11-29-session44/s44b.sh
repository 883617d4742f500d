#!/usr/bin/env bash
# v104 (the plan's token hint turns v103's left half of S ahead off for short units) on the GPU: its tests (the seesaw's
# flag per hint against the reference; a 128-head warm-up after which no short-hinted serving step compiles), then
# where the threshold sits: v103 on (from 4 row tiles) and off in one process (setting_ab.py, unhinted plans) on units
# of 24 and 48 tiles at q_len 2 and of 16 and 32 at q_len 4.
set -uo pipefail
R=$OUT/s44b
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R hint 200 tests/test_triton_decode_gpu.py -v -k "token_hint" &
benchmarks/experiments/gpu_test_shard.sh $R warmup 200 tests/test_warmup.py -v -k "no_step_compiles and bf16-1-1" &
wait
for f in hint warmup; do tail -n 2 $R/tests-$f.txt; grep "FAILED\|Error" $R/tests-$f.txt | head; done
echo "tests $(( $(date +%s) - t0 )) s"
PYTHONPATH=src:benchmarks/experiments:tests timeout 150 python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.LEFT_SCORES_AHEAD_MIN_ROW_TILES from4=4 never=1000000 -- \
  128,64,1536,2 128,64,3072,2 128,32,1024,4 128,32,2048,4 > $R/setting-ab.txt 2>&1
echo "rc $?" >> $R/setting-ab.txt; grep -v "Warn\|warn" $R/setting-ab.txt | tail -n 14
echo "total $(( $(date +%s) - t0 )) s"
