#!/usr/bin/env bash
# Session 22, call b: v80 (a merge by both warpgroups in a region of its own) — its merge tests, then A/B against HEAD.
set -uo pipefail
PYTHONPATH=build/dev/merge2/src timeout 200 python -m pytest -q -x tests/test_triton_decode_gpu.py -k "merge" -p no:cacheprovider > $OUT/tests-merge2.txt 2>&1
echo "tests rc $?" >> $OUT/tests-merge2.txt
timeout 330 benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src build/dev/merge2/src -- \
  --case 128,64,ragged,1,bf16,64 --case 128,64,ragged,2,bf16,64 --case 128,64,ragged,1,fp8,64 \
  --case 128,16,4096,2,bf16,64 --case 128,64,4096,1,bf16,64 --case 64,64,ragged,2,bf16,64 \
  --backends triton --no-baseline --clean-l2 > $OUT/ab-v80.txt 2>&1
echo "ab rc $?" >> $OUT/ab-v80.txt
