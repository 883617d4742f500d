#!/usr/bin/env bash
# Session 21, call 8: the review's mends on the GPU: launch keys as HintedKey (evict-first named), the merge test's
# combine guard that now raises; the decode GPU tests, L2-hint, dispatch, eager-call and graph tests; then
# benchmarks/experiments/beside_flashmla.sh (mended) on one case.
# carry: build/dev build/flashmla-src
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=src timeout 280 python -m pytest -q -n 8 tests/test_triton_decode_gpu.py tests/test_l2_evict_first.py \
  tests/test_hopper_dispatch.py tests/test_eager_calls.py tests/test_graphs.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
bash benchmarks/experiments/beside_flashmla.sh $OUT build/flashmla-src 240 "check=16,16,1024,1"
