#!/usr/bin/env bash
# Session 38's s39b-prepared.sh with the tests cut at 450 s and the cache scan at 100 s (run 0 was cut in its scan at the
# call's 600 s): half HALF of the whole GPU decode test file under Triton 3.7.1 (carry ["build/triton37"]).
set -uo pipefail
HALF=${1:-0}
R=$OUT/s39b-$HALF
mkdir -p $R /tmp/cache37
source benchmarks/experiments/with_packed_triton.sh build/triton37
PYTHONPATH=$PACKED_TRITON:src python -m pytest --collect-only -q -m gpu -p no:cacheprovider \
  tests/test_triton_decode_gpu.py | grep "::" | awk -v h=$HALF 'NR % 2 == h' > $R/ids.txt
TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 20 450 python -m pytest -q -rA \
  --tb=short -p no:cacheprovider $(cat $R/ids.txt) > $R/tests-t37.txt 2>&1
echo "rc $?" >> $R/tests-t37.txt
timeout 100 env PYTHONPATH=$PACKED_TRITON:src python scripts/gluon_compile_check.py --scan-cache /tmp/cache37 > $R/scan-t37.txt 2>&1
echo "$(grep -c PASSED $R/tests-t37.txt) passed, $(grep -c '^FAILED\|^ERROR' $R/tests-t37.txt) failed of $(wc -l < $R/ids.txt)"
grep -E "^(FAILED|ERROR)" $R/tests-t37.txt | head -5; tail -n 1 $R/scan-t37.txt
