#!/usr/bin/env bash
# The GPU share-plan and kv-range tests s38b's limit cut off (its 19 passed under both versions), under Triton 3.7.1
# (packed; carry ["build/triton37"]) and the image's 3.6 side by side.
set -uo pipefail
R=$OUT/s38c
mkdir -p $R
source benchmarks/experiments/with_packed_triton.sh build/triton37
tests() {  # NAME PYTHONPATH LIMIT PYTEST_ARGS...
  local name=$1 path=$2 limit=$3; shift 3
  local start=$(date +%s)
  TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$path timeout -s INT -k 20 $limit python -m pytest -q -rA --tb=short \
    -p no:cacheprovider "$@" > $R/$name.txt 2>&1
  echo "rc $? after $(( $(date +%s) - start ))s" >> $R/$name.txt
}
SELECT="equal_share_plans or ragged_batches or share_plans_merge or kv_range"
tests tests-t37 $PACKED_TRITON:src 430 tests/test_triton_decode_gpu.py -k "$SELECT" &
tests tests-t36 src 430 tests/test_triton_decode_gpu.py -k "$SELECT" &
wait
for f in $R/tests-*.txt; do echo "== $f"; grep -E "passed|failed|skipped|^rc " $f | tail -2; grep -E "^(FAILED|ERROR)" $f | cut -c1-160 | head -8; done
