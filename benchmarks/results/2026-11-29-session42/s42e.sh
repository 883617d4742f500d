#!/usr/bin/env bash
# Forty-second session, call 2 of a pair (s42c.sh first, carry ["build/t39a"]; this one carry ["build/t39b"]): s42d's
# plan-layout tests XPASSed under Triton 3.9.0, so "3.9." goes into SHARE_PLAN_TRITONS (in the tree sent) and the
# share / equal / ragged / kv-range decode GPU tests run again under 3.9.0 with shares; the prefill GPU files with the
# time s42d's 120 s cut; every kernel compiled scanned for predicated warp collectives (the image's nvdisasm now
# linked beside the packed ptxas-blackwell).
set -uo pipefail
R=$OUT/s42e
mkdir -p $R /tmp/cache39
t0=$(date +%s)
source benchmarks/experiments/with_packed_triton.sh build/t39a build/t39b
T39=$PACKED_TRITON:src
grep -n "^SHARE_PLAN_TRITONS" src/mlakit/kernels/decode_split_plan.py
TRITON_CACHE_DIR=/tmp/cache39 PYTHONPATH=$T39 timeout -s INT -k 10 150 python -m pytest -q -rfEs --tb=short \
  -p no:cacheprovider tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "share or equal or ragged_batches or kv_range" > $R/tests-t39-shares.txt 2>&1
echo "rc $?" >> $R/tests-t39-shares.txt; tail -n 2 $R/tests-t39-shares.txt; echo "tests $(( $(date +%s) - t0 )) s"
TRITON_CACHE_DIR=/tmp/cache39 PYTHONPATH=$T39 timeout -s INT -k 10 330 python -m pytest -q -rfE -p no:cacheprovider \
  --tb=short -W ignore::UserWarning tests/test_prefill_hopper_gpu.py tests/test_prefill_gpu.py > $R/prefill-t39.txt 2>&1
echo "rc $?" >> $R/prefill-t39.txt; tail -n 2 $R/prefill-t39.txt; echo "prefill $(( $(date +%s) - t0 )) s"
PYTHONPATH=$T39 timeout 60 python scripts/gluon_compile_check.py --scan-cache /tmp/cache39 \
  > $R/scan-t39.txt 2>&1; tail -n 1 $R/scan-t39.txt; echo "total $(( $(date +%s) - t0 )) s"
