#!/usr/bin/env bash
# v90 as landed (the next unit's L2 prefetch on fp8 pages only, one tile pair ahead): its new GPU test (same bits with
# the prefetch never, 1 or 3 pairs ahead), the fixed-split snake-order tests (both dtypes), the 128-head fp8 tests and
# the persistent-kernel tests; one process.
set -uo pipefail
R=$OUT/s28f
mkdir -p $R
timeout -s INT -k 20 420 python -m pytest -q -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "prefetch or snake or (e4m3 and 128) or persistent or several_waves" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -4 $R/tests.txt
