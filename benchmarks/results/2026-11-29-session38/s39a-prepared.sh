#!/usr/bin/env bash
# Prepared, not run (the thirty-eighth session's device time is spent). 22ffc62 changed the plan kernel once more after
# s38b-s38e (the split-count loop bounded by the unconditional largest count): the share-plan, kv-range and prefetch
# GPU tests under the image's Triton 3.6, then diag38's plan under 3.7.1 (packed; carry ["build/triton37"]), then
# every kernel both runs compiled scanned for predicated warp collectives (gluon_compile_check.py --scan-cache).
set -uo pipefail
R=$OUT/s39a
mkdir -p $R /tmp/cache36 /tmp/cache37 /tmp/dumps
source benchmarks/experiments/with_packed_triton.sh build/triton37
TRITON_CACHE_DIR=/tmp/cache36 PYTHONPATH=src timeout -s INT -k 20 360 python -m pytest -q -rA --tb=short \
  -p no:cacheprovider tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "share or equal or ragged_batches or kv_range or prefetch or several_waves" > $R/tests-t36.txt 2>&1
echo "rc $?" >> $R/tests-t36.txt
TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src python benchmarks/results/2026-11-29-session38/diag38.py \
  /tmp/dumps t37 2>&1 | tail -2 | tee $R/plan-t37.txt
PYTHONPATH=src python scripts/gluon_compile_check.py --scan-cache /tmp/cache36 > $R/scan-t36.txt 2>&1
PYTHONPATH=$PACKED_TRITON:src python scripts/gluon_compile_check.py --scan-cache /tmp/cache37 > $R/scan-t37.txt 2>&1
grep -E "passed|failed|^rc " $R/tests-t36.txt | tail -2; grep -E "^(FAILED|ERROR)" $R/tests-t36.txt | head -5
tail -n 1 $R/scan-t36.txt $R/scan-t37.txt
