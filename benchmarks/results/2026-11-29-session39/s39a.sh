#!/usr/bin/env bash
# 22ffc62's plan-kernel loop bound, first GPU run (session 38's s39a-prepared.sh, its Triton 3.6 half): the share-plan,
# kv-range, prefetch and several-wave GPU tests under the image's Triton 3.6, every kernel they compiled scanned for
# predicated warp collectives; FlashMLA 9241ae3 built first for s39b (carry ["build/flashmla-src"]).
set -uo pipefail
R=$OUT/s39a
mkdir -p $R /tmp/cache36
t0=$(date +%s)
timeout 200 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $R/build.txt 2>&1
echo "build $(( $(date +%s) - t0 )) s: $(tail -1 $R/build.txt)"
TRITON_CACHE_DIR=/tmp/cache36 PYTHONPATH=src timeout -s INT -k 20 340 python -m pytest -q -rA --tb=short \
  -p no:cacheprovider tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "share or equal or ragged_batches or kv_range or prefetch or several_waves" > $R/tests-t36.txt 2>&1
echo "rc $?" >> $R/tests-t36.txt
PYTHONPATH=src python scripts/gluon_compile_check.py --scan-cache /tmp/cache36 > $R/scan-t36.txt 2>&1
echo "$(grep -c PASSED $R/tests-t36.txt) passed, $(grep -c '^FAILED\|^ERROR' $R/tests-t36.txt) failed"
grep -E "^(FAILED|ERROR)" $R/tests-t36.txt | head -5; tail -n 1 $R/tests-t36.txt $R/scan-t36.txt
