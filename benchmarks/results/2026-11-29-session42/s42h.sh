#!/usr/bin/env bash
# Forty-second session, last call, no carry, image's Triton 3.6: the GPU demo on the session's last code, then the
# doctests of the plan and launch modules (share_plans_laid_out_right's failed without the interpreter before
# bfdd8e8) and the eager-call GPU tests.
set -uo pipefail
R=$OUT/s42h
mkdir -p $R
t0=$(date +%s)
PYTHONPATH=src timeout 110 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 3 $R/demo-gpu.txt; echo "demo $(( $(date +%s) - t0 )) s"
PYTHONPATH=src timeout -s INT -k 5 $(( 200 - ($(date +%s) - t0) )) python -m pytest -q -rfE --tb=short \
  -p no:cacheprovider src/mlakit/kernels/decode_split_plan.py src/mlakit/kernels/launch.py tests/test_eager_calls.py \
  > $R/tests-t36.txt 2>&1; echo "rc $?" >> $R/tests-t36.txt; tail -n 2 $R/tests-t36.txt
echo "total $(( $(date +%s) - t0 )) s"
