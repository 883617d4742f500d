#!/usr/bin/env bash
# Prepared in the thirty-ninth session, run in the fortieth. Carry ["build/triton37"]. v102 first met a GPU:
# the share-plan GPU tests (their layout tests now over shares of equal tiles and of equal cost, and over random
# leads) under the image's Triton 3.6 and under 3.7.1 (packed), every kernel they compiled scanned for predicated warp
# collectives. Then s40b.sh.
set -uo pipefail
R=$OUT/s40a
mkdir -p $R /tmp/cache36 /tmp/cache37
source benchmarks/experiments/with_packed_triton.sh build/triton37
tests="tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py"
select="share or equal or ragged_batches or kv_range"
TRITON_CACHE_DIR=/tmp/cache36 PYTHONPATH=src timeout -s INT -k 10 240 python -m pytest -q -p no:cacheprovider $tests \
  -k "$select" > $R/tests-t36.txt 2>&1; echo "rc $?" >> $R/tests-t36.txt
TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 240 python -m pytest -q \
  -p no:cacheprovider $tests -k "$select" > $R/tests-t37.txt 2>&1; echo "rc $?" >> $R/tests-t37.txt
tail -n 2 $R/tests-t36.txt $R/tests-t37.txt
PYTHONPATH=src timeout 40 python scripts/gluon_compile_check.py --scan-cache /tmp/cache36 | tail -n 1
PYTHONPATH=$PACKED_TRITON:src timeout 40 python scripts/gluon_compile_check.py --scan-cache /tmp/cache37 | tail -n 1
