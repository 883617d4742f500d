#!/usr/bin/env bash
# The GPU tests s36a's shard did not reach (it stopped at its limit inside the FlashInfer drop-in's file, printing no
# names): the serving callers first, then both drop-ins, one line a test (-v).
set -uo pipefail
R=$OUT/s36b
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R serving 200 -v tests/test_forward.py tests/test_warmup.py tests/test_api.py
benchmarks/experiments/gpu_test_shard.sh $R drop-ins 330 -v tests/test_compat_flashinfer_gpu.py tests/test_compat_flash_mla_gpu.py
for f in $R/tests-*.txt; do echo "$f: $(grep -c PASSED $f) passed, $(grep -c 'FAILED\|ERROR' $f) failed"; tail -n 1 $f; done
grep -h "FAILED\|ERROR" $R/tests-*.txt | head
