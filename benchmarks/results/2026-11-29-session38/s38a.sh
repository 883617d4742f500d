#!/usr/bin/env bash
# v101 under Triton 3.7.1 (packed, benchmarks/experiments/pack_triton.sh 3.7.1 build/triton37; carry ["build/triton37"]):
# (1) diag38.py's share plan (132 items expected; HEAD gave 66 under 3.7.1) under 3.7.1 at HEAD, 3.7.1 with v101
# (benchmarks/experiments/patches/v101-share-rounds-outside-the-branch.diff on a copy of src, "3.7." added to
# SHARE_PLAN_TRITONS) and 3.6 at HEAD, each launch's TTGIR / PTX / SASS saved (dumps.tgz); (2) with v101 under 3.7.1, the
# share layout tests and the GPU share-plan, kv-range and prefetch tests; (3) beside it, under 3.7.1 at HEAD, the GPU
# tests s37a-s37d did not run (drop-ins, graphs, eager calls, forward, warm-up, workspace, fuzz, fp8 scales, ...).
set -uo pipefail
R=$OUT/s38a
D=/tmp/dumps
mkdir -p $R $D build/dev/v101
source benchmarks/experiments/with_packed_triton.sh build/triton37
rm -rf build/dev/v101/src && cp -r src build/dev/v101/ &&
  patch -p1 -d build/dev/v101 < benchmarks/experiments/patches/v101-share-rounds-outside-the-branch.diff &&
  sed -i 's/^SHARE_PLAN_TRITONS = ("3.6.",)/SHARE_PLAN_TRITONS = ("3.6.", "3.7.")/' build/dev/v101/src/mlakit/kernels/decode_split_plan.py
grep -n "^SHARE_PLAN_TRITONS\|share_rounds" build/dev/v101/src/mlakit/kernels/decode_split_plan.py
H=benchmarks/results/2026-11-29-session38
tests() {  # NAME PYTHONPATH SRC LIMIT PYTEST_ARGS...
  local name=$1 path=$2 src=$3 limit=$4; shift 4
  local start=$(date +%s)
  TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$path timeout -s INT -k 20 $limit python -m pytest -q -rA --tb=short \
    -p no:cacheprovider -o pythonpath=$src "$@" > $R/$name.txt 2>&1
  echo "rc $? after $(( $(date +%s) - start ))s" >> $R/$name.txt
}
tests t37-head-rest $PACKED_TRITON:src src 470 -m gpu tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py \
  tests/test_graphs.py tests/test_eager_calls.py tests/test_forward.py tests/test_warmup.py tests/test_workspace.py \
  tests/test_fuzz_attention.py tests/test_fp8_scales.py tests/test_gather_decompress_gpu.py tests/test_l2_evict_first.py \
  tests/test_prefill_gpu.py tests/test_prefill_prepared.py tests/test_bench_graphs_gpu.py tests/test_gpu.py &
for run in "head-t37 $PACKED_TRITON:src" "v101-t37 $PACKED_TRITON:build/dev/v101/src" "head-t36 src"; do
  set -- $run
  TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$2 python $H/diag38.py $D $1 2>&1 | tail -4 | tee -a $R/plans.txt
done
tar czf $R/dumps.tgz -C $D .
tests t37-v101-shares $PACKED_TRITON:build/dev/v101/src build/dev/v101/src 380 tests/test_decode_share_plan.py \
  tests/test_triton_decode_gpu.py -k "share or equal or ragged_batches or kv_range or prefetch or several_waves"
wait
for f in $R/t37-*.txt; do echo "== $f"; grep -E "passed|failed|skipped|^rc " $f | tail -2; grep -E "^(FAILED|ERROR)" $f | cut -c1-160 | head -8; done
