#!/usr/bin/env bash
# v88 with equal shares on by default: the GPU decode tests in one process on the GPU alone, then the fuzz, the FlashMLA
# drop-in, graph, demo and eager tests in a second process after it (never two at once: s26d-f's concurrent shards
# stalled).
set -uo pipefail
R=$OUT/s27c
mkdir -p $R
S=benchmarks/experiments/gpu_test_shard.sh
$S $R decode 300 tests/test_triton_decode_gpu.py
$S $R rest $((560 - SECONDS)) tests/test_fuzz_attention.py tests/test_compat_flash_mla_gpu.py tests/test_graphs.py \
  tests/test_demo.py tests/test_eager_calls.py tests/test_bench_graphs_gpu.py tests/test_gpu.py tests/test_forward.py
for f in $R/tests-*.txt; do echo "== $f"; grep -E "passed|failed|error|^rc |Interrupted|FAILED" $f | tail -8; done
