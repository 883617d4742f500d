#!/usr/bin/env bash
# The one test of s39b-0's half its time limit cut, under Triton 3.7.1 (carry ["build/triton37"]), then the GPU demo on
# HEAD under the image's Triton 3.6, then the scan of the 3.7.1 cache the whole-file halves left (as long as time lasts).
set -uo pipefail
R=$OUT/s39d
mkdir -p $R /tmp/cache37
source benchmarks/experiments/with_packed_triton.sh build/triton37
TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 90 python -m pytest -q -rA --tb=short \
  -p no:cacheprovider \
  "tests/test_triton_decode_gpu.py::test_hopper_kernels_read_each_splits_kv_range_from_the_plan[fp8_e4m3-16-128-64-hopper]" \
  > $R/test-t37.txt 2>&1
tail -n 1 $R/test-t37.txt
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 4 $R/demo-gpu.txt
ls /tmp/cache37 | wc -l
timeout 80 env PYTHONPATH=$PACKED_TRITON:src python scripts/gluon_compile_check.py --scan-cache /tmp/cache37 \
  > $R/scan-t37.txt 2>&1; echo "rc $?" >> $R/scan-t37.txt
tail -n 2 $R/scan-t37.txt
