#!/usr/bin/env bash
# tests/test_graphs.py under 3.6 (s41b cut it at 100 s), then equal shares under Triton 3.8.0 (carry
# ["build/triton38"]; the tree with "3.8." added to decode_split_plan.SHARE_PLAN_TRITONS): the share-plan and decode
# GPU tests of s41b, every kernel scanned; then share-plan cases under 3.6 and 3.8.0 in alternating processes.
set -uo pipefail
R=$OUT/s41c
mkdir -p $R /tmp/cache38
t0=$(date +%s)
PYTHONPATH=src timeout -s INT -k 10 250 python -m pytest -q -rfE --tb=short -p no:cacheprovider tests/test_graphs.py \
  > $R/graphs-t36.txt 2>&1; echo "rc $?" >> $R/graphs-t36.txt; tail -n 2 $R/graphs-t36.txt
echo "graphs $(( $(date +%s) - t0 )) s"
source benchmarks/experiments/with_packed_triton.sh build/triton38
TRITON_CACHE_DIR=/tmp/cache38 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 200 python -m pytest -q -rfEs \
  --tb=short -p no:cacheprovider tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "share or equal or ragged_batches or kv_range" > $R/tests-t38.txt 2>&1; echo "rc $?" >> $R/tests-t38.txt
echo "tests $(( $(date +%s) - t0 )) s"; tail -n 2 $R/tests-t38.txt
PYTHONPATH=$PACKED_TRITON:src timeout 30 python scripts/gluon_compile_check.py --scan-cache /tmp/cache38 \
  > $R/scan-t38.txt 2>&1; tail -n 1 $R/scan-t38.txt
cases="--case 128,64,ragged,2 --case 128,64,ragged,1 --case 128,40,8192,2 --case 128,64,ragged,2,fp8_e4m3"
TRITON_CACHE_DIR=/tmp/cache38 timeout 110 benchmarks/experiments/ab_source_trees.sh 1 src $PACKED_TRITON:src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-t36-t38.txt 2>&1; echo "rc $?" >> $R/ab-t36-t38.txt
echo "all $(( $(date +%s) - t0 )) s"; grep -v Warn $R/ab-t36-t38.txt | cut -c1-130
