#!/usr/bin/env bash
# Run as one command on the warm machine after s38d: the kv-range tests and the 32-SM share-plan test s38c's limit cut
# off, under Triton 3.7.1 (packed; carry ["build/triton37"]); "-k ... 32" also matched the four 132-SM cases.
source benchmarks/experiments/with_packed_triton.sh build/triton37; mkdir -p $OUT/s38e
PYTHONPATH=$PACKED_TRITON:src timeout -s INT -k 10 170 python -m pytest -q -rA --tb=short -p no:cacheprovider \
  tests/test_triton_decode_gpu.py -k "kv_range or (equal_share_plans and 32)" > $OUT/s38e/tests-t37.txt 2>&1
echo "rc $?" >> $OUT/s38e/tests-t37.txt
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^rc " $OUT/s38e/tests-t37.txt | cut -c1-160
