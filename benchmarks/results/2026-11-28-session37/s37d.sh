#!/usr/bin/env bash
# After the compat alias and the share-plan guard: (1) under Triton 3.7.1 the decode GPU tests s37b's failures hid
# (share-plan tests now skipped there); (2) under 3.7.1 the share layout tests of tests/test_decode_share_plan.py on
# the GPU, which bypass the guard (expected to fail: the layout bug s37c found); (3) under the image's 3.6 the same
# layout tests and the GPU share-plan tests (the guard changes nothing there). Carry ["build/triton37"].
set -uo pipefail
R=$OUT/s37d
mkdir -p $R /tmp/t37
[ -f /tmp/t37/triton/_C/libtriton.so ] || { tar -xJf build/triton37/package.tar.xz -C /tmp/t37 &&
  xz -dc build/triton37/libtriton.so.xz > /tmp/t37/triton/_C/libtriton.so; }
export TRITON_BACKENDS_IN_TREE=1
export TRITON_PTXAS_PATH=$(python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin/ptxas
t() {  # NAME PYTHONPATH LIMIT PYTEST_ARGS...
  local name=$1 path=$2 limit=$3; shift 3
  PYTHONPATH=$path timeout -s INT -k 15 $limit python -m pytest -q -rA --tb=line -p no:cacheprovider "$@" > $R/$name.txt 2>&1
  echo "rc $?" >> $R/$name.txt
}
t t37-gpu /tmp/t37:src 330 -m gpu tests/test_triton_decode_gpu.py \
  -k "kv_range or prefetch or equal_share or ragged_batches or share_plans_merge or several_waves" &
t t37-layout /tmp/t37:src 200 tests/test_decode_share_plan.py &
t t36-shares src 330 tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
  -k "share or equal or ragged_batches or kv_range or prefetch" &
wait
for f in $R/*.txt; do echo "== $f"; grep -E "passed|failed|skipped|^rc " $f | tail -2; grep -E "^(FAILED|ERROR)" $f | cut -c1-160 | head -8; done
