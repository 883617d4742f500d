#!/usr/bin/env bash
# v101 as landed (the plan kernel's reductions out of its runtime `if`s; "3.7." in SHARE_PLAN_TRITONS), under Triton
# 3.7.1 (packed; carry ["build/triton37"]) and the image's 3.6: diag38.py's share plan (132 items expected) with each
# launch's SASS (dumps.tgz), the share layout tests and the GPU share-plan, kv-range and prefetch tests under each
# version side by side, then the GPU demo under 3.6 alone.
set -uo pipefail
R=$OUT/s38b
D=/tmp/dumps
H=benchmarks/results/2026-11-29-session38
mkdir -p $R $D
source benchmarks/experiments/with_packed_triton.sh build/triton37
tests() {  # NAME PYTHONPATH LIMIT PYTEST_ARGS...
  local name=$1 path=$2 limit=$3; shift 3
  local start=$(date +%s)
  TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$path timeout -s INT -k 20 $limit python -m pytest -q -rA --tb=short \
    -p no:cacheprovider "$@" > $R/$name.txt 2>&1
  echo "rc $? after $(( $(date +%s) - start ))s" >> $R/$name.txt
}
SELECT="share or equal or ragged_batches or kv_range or prefetch or several_waves"
tests tests-t37 $PACKED_TRITON:src 330 tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py -k "$SELECT" &
tests tests-t36 src 330 tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py -k "$SELECT" &
for run in "v101-t37 $PACKED_TRITON:src" "v101-t36 src"; do
  set -- $run
  TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$2 python $H/diag38.py $D $1 2>&1 | tail -3 | tee -a $R/plans.txt
  echo "$1 predicated REDUX: $(grep -c '@!\?U\?P[0-9]* *REDUX' $D/$1.sass)" | tee -a $R/plans.txt
done
tar czf $R/dumps.tgz -C $D .
wait
for f in $R/tests-*.txt; do echo "== $f"; grep -E "passed|failed|skipped|^rc " $f | tail -2; grep -E "^(FAILED|ERROR)" $f | cut -c1-160 | head -8; done
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 4 $R/demo-gpu.txt
