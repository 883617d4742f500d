#!/usr/bin/env bash
# Forty-second session, call 2 of a pair (s42c.sh first, carry ["build/t39a"]; this one carry ["build/t39b"]). Every
# launch now names fp fusion (kernels.launch.COMPILE_OPTIONS): under the image's Triton 3.6 the eager-call GPU tests
# (direct launches checked against Triton's own choice) and the share / ragged / kv-range decode GPU tests; under
# 3.9.0 with shares the tests s42e's limit left unrun (the two merge tests, the four kv-range tests).
set -uo pipefail
R=$OUT/s42f
mkdir -p $R /tmp/cache39
t0=$(date +%s)
PYTHONPATH=src timeout -s INT -k 10 200 python -m pytest -q -rfEs --tb=short -p no:cacheprovider \
  tests/test_eager_calls.py tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "not test_triton_decode_gpu or share or equal or ragged_batches or kv_range" > $R/tests-t36.txt 2>&1
echo "rc $?" >> $R/tests-t36.txt; tail -n 2 $R/tests-t36.txt; echo "t36 $(( $(date +%s) - t0 )) s"
source benchmarks/experiments/with_packed_triton.sh build/t39a build/t39b
TRITON_CACHE_DIR=/tmp/cache39 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 $(( 560 - ($(date +%s) - t0) )) \
  python -m pytest -q -rfEs --tb=short -p no:cacheprovider tests/test_triton_decode_gpu.py \
  -k "merge_in_the_combine or kv_range" > $R/tests-t39.txt 2>&1
echo "rc $?" >> $R/tests-t39.txt; tail -n 2 $R/tests-t39.txt; echo "total $(( $(date +%s) - t0 )) s"
