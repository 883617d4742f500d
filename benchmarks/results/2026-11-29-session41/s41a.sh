#!/usr/bin/env bash
# The GPU demo on HEAD, then the GPU tests of the files the fortieth session's input audit touched and no GPU ran
# (image's Triton 3.6). No carry.
set -uo pipefail
R=$OUT/s41a
mkdir -p $R
t0=$(date +%s)
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
echo "demo $(( $(date +%s) - t0 )) s"; tail -n 4 $R/demo-gpu.txt
PYTHONPATH=src timeout -s INT -k 20 330 python -m pytest -q -rfE --tb=short -p no:cacheprovider \
  tests/test_mla_attention.py tests/test_warmup.py tests/test_checks.py tests/test_forward.py tests/test_cache_write.py \
  tests/test_fp8_scales.py > $R/tests-t36.txt 2>&1
echo "rc $?" >> $R/tests-t36.txt
echo "tests $(( $(date +%s) - t0 )) s"; tail -n 3 $R/tests-t36.txt
