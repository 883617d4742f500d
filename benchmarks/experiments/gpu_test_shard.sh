#!/usr/bin/env bash
# Device helper: one shard of the GPU tests, its output and exit status in OUTDIR/tests-NAME.txt. From the
# repository root: benchmarks/experiments/gpu_test_shard.sh OUTDIR NAME LIMIT_S PYTEST_ARGS...
# e.g. benchmarks/experiments/gpu_test_shard.sh $OUT/r fuzz 500 tests/test_fuzz_attention.py &
# At the limit pytest gets SIGINT first (it then prints the line of the test it was in and its summary), SIGKILL 20 s
# later; the summary names every finished test (-rA) and the slowest five.
set -uo pipefail
out=$1 name=$2 limit=$3
shift 3
start=$(date +%s)
PYTHONPATH=src timeout -s INT -k 20 "$limit" python -m pytest -q -rA --durations=5 -p no:cacheprovider -m gpu "$@" \
  > "$out/tests-$name.txt" 2>&1
echo "rc $? after $(( $(date +%s) - start ))s" >> "$out/tests-$name.txt"
