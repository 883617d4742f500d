#!/usr/bin/env bash
# One page-size hint rule: the FlashMLA drop-in over per-group fp8 scales planned as before and as now
# (s36a_drop_in_per_group.py), the GPU tests of the callers that changed, then the GPU demo.
set -uo pipefail
R=$OUT/s36a
mkdir -p $R
D=benchmarks/results/2026-11-28-session36
PYTHONPATH=src:tests timeout 150 python $D/s36a_drop_in_per_group.py 2>&1 | grep -v "Warn\|_sync_debug" > $R/drop-in-per-group.txt
cat $R/drop-in-per-group.txt
benchmarks/experiments/gpu_test_shard.sh $R hint 230 tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py \
  tests/test_forward.py tests/test_warmup.py tests/test_api.py
tail -n 2 $R/tests-hint.txt
grep -h "^FAILED\|^ERROR" $R/tests-hint.txt | head
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 4 $R/demo-gpu.txt
