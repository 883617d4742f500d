#!/usr/bin/env bash
# Prepared in the forty-fifth session (not run: its device time was spent): the GPU checks of that session's CPU-only
# changes (a serving step's decode and extend metadata built once a step, also under decode_backend="auto",
# `mlakit.backend_for`; the drop-ins' and the model's bad-input fixes; the FlashInfer drop-in's non-blocking uploads;
# the warm-up's batch 1 and one-token extends; the prefill gather kernel unspecialized on its row count, now in the
# no-compile test's kernel list): the forward, API, drop-in, gather and GPU files and the warm-up no-compile tests in
# two shards, and the GPU demo beside them (the model path: idle-sequence check, non-blocking index uploads).
set -uo pipefail
R=$OUT/s46a
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R forward 420 tests/test_forward.py tests/test_api.py \
  tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py tests/test_gather_decompress_gpu.py \
  tests/test_gpu.py tests/test_graphs.py &
benchmarks/experiments/gpu_test_shard.sh $R warmup 420 tests/test_warmup.py &
PYTHONPATH=src timeout 420 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
wait
for f in $R/tests-*.txt; do echo "$(basename $f): $(tail -n 2 $f | head -n 1)"; grep "^FAILED" $f | head -5; done
tail -n 3 $R/demo-gpu.txt
echo "total $(( $(date +%s) - t0 )) s"
