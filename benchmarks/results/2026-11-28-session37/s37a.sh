#!/usr/bin/env bash
# The Gluon kernels under Triton 3.7.1 (torch 2.13's pin) on the device, whose image has 3.6: the GPU tests of the
# Hopper decode and prefill kernels with 3.7.1 first on the path. Carried as build/triton37/ (the wheel's package
# without its bundled ptxas and profiler libraries, libtriton.so stripped, each xz-compressed to fit the carry); ptxas
# is the image's Triton's own. Carry ["build/triton37"].
set -uo pipefail
R=$OUT/s37a
mkdir -p $R /tmp/t37
tar -xJf build/triton37/package.tar.xz -C /tmp/t37
xz -dc build/triton37/libtriton.so.xz > /tmp/t37/triton/_C/libtriton.so && chmod +x /tmp/t37/triton/_C/libtriton.so
export TRITON_BACKENDS_IN_TREE=1
export TRITON_PTXAS_PATH=$(python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin/ptxas
$TRITON_PTXAS_PATH --version | tail -1
PYTHONPATH=/tmp/t37:src python -c "import triton, torch; print('triton', triton.__version__, triton.__file__, 'torch', torch.__version__)" | tee $R/versions.txt
python -c "import triton; print('image triton', triton.__version__)" | tee -a $R/versions.txt
shard() {  # NAME LIMIT PYTEST_ARGS...
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  PYTHONPATH=/tmp/t37:src timeout -s INT -k 20 "$limit" python -m pytest -q -rA --durations=5 -p no:cacheprovider -m gpu "$@" \
    > "$R/tests-$name.txt" 2>&1
  echo "rc $? after $(( $(date +%s) - start ))s" >> "$R/tests-$name.txt"
}
shard decode 520 tests/test_triton_decode_gpu.py tests/test_gpu.py \
  -k "hopper_kernel_matches or page_sizes or e4m3_scores or persistent or share or ragged_batches or 128_heads or prefetch or padded or narrow or graph or subnormal" &
shard prefill 520 tests/test_prefill_hopper_gpu.py tests/test_prefill_fp8_gpu.py &
wait
for f in $R/tests-*.txt; do echo "== $f"; grep -E "passed|failed|error|^rc " $f | tail -3; grep -E "^(FAILED|ERROR)" $f | head -5; done
