#!/usr/bin/env bash
# The landed form (v104 at 38 tiles, the FlashInfer CUDA-graph wrapper unhinted, row_tiles unspecialized on alignment,
# the warm-up's extend grid), no carry, image's Triton 3.6: the GPU demo, then in parallel shards the three warm-up
# no-compile tests, the FlashInfer drop-in's GPU tests (CUDA-graph re-plans), the FlashMLA drop-in's and the graph
# tests, and the token-hint test.
set -uo pipefail
R=$OUT/s44f
mkdir -p $R
t0=$(date +%s)
PYTHONPATH=src timeout 130 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 3 $R/demo-gpu.txt; grep -i "warm" $R/demo-gpu.txt | head -3; echo "demo $(( $(date +%s) - t0 )) s"
benchmarks/experiments/gpu_test_shard.sh $R warmup 280 tests/test_warmup.py -v -k "no_step_compiles" &
benchmarks/experiments/gpu_test_shard.sh $R flashinfer 280 tests/test_compat_flashinfer_gpu.py -v &
benchmarks/experiments/gpu_test_shard.sh $R flashmla 280 tests/test_compat_flash_mla_gpu.py tests/test_graphs.py \
  tests/test_triton_decode_gpu.py -v -k "not test_triton_decode_gpu or token_hint" &
wait
for f in warmup flashinfer flashmla; do tail -n 2 $R/tests-$f.txt; grep "FAILED\|^E " $R/tests-$f.txt | head -6; done
echo "total $(( $(date +%s) - t0 )) s"
