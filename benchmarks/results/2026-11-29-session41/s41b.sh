#!/usr/bin/env bash
# The decode kernels under Triton 3.8.0 (packed; carry ["build/triton38"]), no session having run them: the share-plan
# and decode GPU tests s40a ran (share / equal / ragged / kv-range, bf16 and fp8), every kernel they compiled scanned
# for predicated warp collectives; then issue 23's cases under the image's 3.6 and under 3.8.0 in alternating
# processes (ab_source_trees.sh, clean L2, two rounds). Also tests/test_graphs.py under 3.6 (DecodeGraphs.run's new
# value checks).
set -uo pipefail
R=$OUT/s41b
mkdir -p $R /tmp/cache38
t0=$(date +%s)
PYTHONPATH=src timeout -s INT -k 10 100 python -m pytest -q -rfE --tb=short -p no:cacheprovider tests/test_graphs.py \
  > $R/graphs-t36.txt 2>&1; echo "rc $?" >> $R/graphs-t36.txt; tail -n 2 $R/graphs-t36.txt
source benchmarks/experiments/with_packed_triton.sh build/triton38
PYTHONPATH=$PACKED_TRITON:src python -c "import triton; print('triton', triton.__version__)"
TRITON_CACHE_DIR=/tmp/cache38 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 230 python -m pytest -q -rfE \
  --tb=short -p no:cacheprovider tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "share or equal or ragged_batches or kv_range" > $R/tests-t38.txt 2>&1; echo "rc $?" >> $R/tests-t38.txt
echo "tests $(( $(date +%s) - t0 )) s"; tail -n 2 $R/tests-t38.txt
PYTHONPATH=$PACKED_TRITON:src timeout 40 python scripts/gluon_compile_check.py --scan-cache /tmp/cache38 \
  > $R/scan-t38.txt 2>&1; tail -n 1 $R/scan-t38.txt
cases="--case 128,64,4096,2 --case 128,64,16384,2 --case 128,64,ragged,2 --case 128,64,4096,1 --case 128,64,4096,1,fp8_e4m3
  --case 128,64,4096,2,fp8_e4m3 --case 16,64,4096,2,fp8_e4m3 --case 16,64,ragged,1"
TRITON_CACHE_DIR=/tmp/cache38 timeout 280 benchmarks/experiments/ab_source_trees.sh 2 src $PACKED_TRITON:src -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-t36-t38.txt 2>&1; echo "rc $?" >> $R/ab-t36-t38.txt
echo "all $(( $(date +%s) - t0 )) s"; cat $R/ab-t36-t38.txt | cut -c1-150
