#!/usr/bin/env bash
# The seesaw's row_tiles no longer specialized on being a multiple of 16 (s44d: a 128-head serving step's extend of
# 6-10 row tiles compiled a variant the warm-up's 16-token extends, 32 row tiles, had compiled as another): the three
# warm-up tests (16 heads bf16 / fp8 with drafts, 128 heads x 2 tokens), the hint and ahead tests, and the decode GPU
# file's extend and graph tests, in parallel shards.
set -uo pipefail
R=$OUT/s44e
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R warmup 300 tests/test_warmup.py -v -k "no_step_compiles" &
benchmarks/experiments/gpu_test_shard.sh $R decode 300 tests/test_triton_decode_gpu.py -v \
  -k "token_hint or extend or graph or share" &
wait
for f in warmup decode; do tail -n 2 $R/tests-$f.txt; grep "FAILED\|^E " $R/tests-$f.txt | head -8; done
echo "total $(( $(date +%s) - t0 )) s"
