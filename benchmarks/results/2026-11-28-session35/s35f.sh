#!/usr/bin/env bash
# The page-size hint over per-group fp8 scales: its GPU tests (forward, warm-up, fp8 scales, eager calls) and the
# per-group decode over plans built with and without the hint (s35f_per_group.py).
set -uo pipefail
R=$OUT/s35f
mkdir -p $R
D=benchmarks/results/2026-11-28-session35
PYTHONPATH=src:tests timeout 120 python $D/s35f_per_group.py 2>&1 | grep -v "Warn\|_sync_debug" > $R/per-group.txt
cat $R/per-group.txt
benchmarks/experiments/gpu_test_shard.sh $R hint 250 tests/test_forward.py tests/test_warmup.py tests/test_fp8_scales.py \
  tests/test_eager_calls.py
tail -n 2 $R/tests-hint.txt
grep -h "^FAILED\|^ERROR" $R/tests-hint.txt | head
