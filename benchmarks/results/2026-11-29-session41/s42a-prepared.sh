#!/usr/bin/env bash
# Prepared in the forty-first session, not run (no device time left). The kernels under Triton 3.9.0 on a GPU for the
# first time (packed: `benchmarks/experiments/pack_triton.sh 3.9.0 build/triton39`, 37.8 MiB, with the tree 63 MiB of
# the 64 the carry allows; carry ["build/triton39"]; the Gluon builds compile there since 2237244's gluon_compat): the
# decode GPU tests s41b ran under 3.8 (share / equal / ragged / kv-range; with 3.9 outside SHARE_PLAN_TRITONS the
# share-plan decode tests skip and the plan kernel's layout tests xfail or XPASS), the prefill GPU
# files, every kernel compiled scanned for predicated warp collectives; then our decode under 3.6 and 3.9.0 in
# alternating processes, two rounds, clean L2. If the layout tests XPASS, add "3.9." to SHARE_PLAN_TRITONS and run the
# share tests again (as s41c did for 3.8).
set -uo pipefail
R=$OUT/s42a
mkdir -p $R /tmp/cache39
source benchmarks/experiments/with_packed_triton.sh build/triton39
PYTHONPATH=$PACKED_TRITON:src python -c "import triton; print('triton', triton.__version__)"
TRITON_CACHE_DIR=/tmp/cache39 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 200 python -m pytest -q -rfEs \
  --tb=short -p no:cacheprovider tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "share or equal or ragged_batches or kv_range" > $R/tests-t39.txt 2>&1; echo "rc $?" >> $R/tests-t39.txt
tail -n 2 $R/tests-t39.txt
TRITON_CACHE_DIR=/tmp/cache39 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 150 python -m pytest -q -rfE \
  --tb=short -p no:cacheprovider tests/test_prefill_hopper_gpu.py tests/test_prefill_gpu.py > $R/prefill-t39.txt 2>&1
echo "rc $?" >> $R/prefill-t39.txt; tail -n 2 $R/prefill-t39.txt
PYTHONPATH=$PACKED_TRITON:src timeout 40 python scripts/gluon_compile_check.py --scan-cache /tmp/cache39 \
  > $R/scan-t39.txt 2>&1; tail -n 1 $R/scan-t39.txt
cases="--case 128,64,4096,2 --case 128,64,ragged,2 --case 128,64,1024,1 --case 128,64,4096,1,fp8_e4m3
  --case 16,64,4096,2,fp8_e4m3 --case 16,128,1024,2"
TRITON_CACHE_DIR=/tmp/cache39 timeout 200 benchmarks/experiments/ab_source_trees.sh 2 src $PACKED_TRITON:src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-t36-t39.txt 2>&1; echo "rc $?" >> $R/ab-t36-t39.txt
grep -v "Warn\|_sync_debug" $R/ab-t36-t39.txt | cut -c1-110
