#!/usr/bin/env bash
# The ragged-share and share-merge GPU tests s38c's limit cut off, under Triton 3.7.1 alone (packed; carry
# ["build/triton37"]), in the time left.
set -uo pipefail
R=$OUT/s38d
mkdir -p $R
source benchmarks/experiments/with_packed_triton.sh build/triton37
PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 215 python -m pytest -q -rA --tb=short -p no:cacheprovider \
  tests/test_triton_decode_gpu.py -k "ragged_batches or share_plans_merge" > $R/tests-t37.txt 2>&1
echo "rc $?" >> $R/tests-t37.txt
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^rc " $R/tests-t37.txt | cut -c1-160
