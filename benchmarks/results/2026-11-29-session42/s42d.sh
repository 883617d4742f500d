#!/usr/bin/env bash
# Forty-second session, call 2 of a pair: carry ["build/t39b"] right after s42c.sh carried build/t39a on the same warm
# machine (`benchmarks/experiments/pack_triton.sh 3.9.0 build/t39a build/t39b`: Triton 3.9.0 with its own
# ptxas-blackwell, which 3.9 compiles sm_90 with; s42b.sh failed on that, its ptxas not found).
# Triton 3.9.0's Gluon builds on a GPU for the first time: the share / equal / ragged / kv-range decode GPU tests with
# 3.9 outside SHARE_PLAN_TRITONS (share-plan tests skip; the plan kernel's layout tests xfail or XPASS); if they XPASS,
# the same tests again with "3.9." added in this machine's copy of the tree; the prefill GPU files; every compiled
# kernel scanned for predicated warp collectives; our decode under 3.6 and 3.9.0 in alternating processes, two
# rounds, clean L2.
set -uo pipefail
R=$OUT/s42d
mkdir -p $R /tmp/cache39
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
source benchmarks/experiments/with_packed_triton.sh build/t39a build/t39b
T39=$PACKED_TRITON:src
PYTHONPATH=$T39 python -c "import triton; print('triton', triton.__version__)"
share_tests() {
  TRITON_CACHE_DIR=/tmp/cache39 PYTHONPATH=$T39 timeout -s INT -k 10 150 python -m pytest -q -rfEs --tb=short \
    -p no:cacheprovider tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py \
    -k "share or equal or ragged_batches or kv_range" > $1 2>&1; echo "rc $?" >> $1; tail -n 2 $1
}
share_tests $R/tests-t39.txt
if grep -q "xpassed" $R/tests-t39.txt && ! grep -q "failed" $R/tests-t39.txt; then
  sed -i 's/SHARE_PLAN_TRITONS = ("3.6.", "3.7.", "3.8.")/SHARE_PLAN_TRITONS = ("3.6.", "3.7.", "3.8.", "3.9.")/' \
    src/mlakit/kernels/decode_split_plan.py
  grep -n "^SHARE_PLAN_TRITONS" src/mlakit/kernels/decode_split_plan.py
  share_tests $R/tests-t39-shares.txt
fi
echo "tests $(( $(date +%s) - t0 )) s"
TRITON_CACHE_DIR=/tmp/cache39 PYTHONPATH=$T39 timeout -s INT -k 10 120 python -m pytest -q -rfE \
  --tb=short -p no:cacheprovider tests/test_prefill_hopper_gpu.py tests/test_prefill_gpu.py > $R/prefill-t39.txt 2>&1
echo "rc $?" >> $R/prefill-t39.txt; tail -n 2 $R/prefill-t39.txt
PYTHONPATH=$T39 timeout 40 python scripts/gluon_compile_check.py --scan-cache /tmp/cache39 \
  > $R/scan-t39.txt 2>&1; tail -n 1 $R/scan-t39.txt
echo "prefill+scan $(( $(date +%s) - t0 )) s"
cases="--case 128,64,4096,2 --case 128,64,ragged,2 --case 128,64,1024,1 --case 128,64,4096,1,fp8_e4m3
  --case 16,64,4096,2,fp8_e4m3 --case 16,128,1024,2"
TRITON_CACHE_DIR=/tmp/cache39 timeout $(( $(left 590) )) benchmarks/experiments/ab_source_trees.sh 2 src $T39 -- \
  $cases --backends triton --no-baseline --clean-l2 > $R/ab-t36-t39.txt 2>&1; echo "rc $?" >> $R/ab-t36-t39.txt
grep -v "Warn\|_sync_debug" $R/ab-t36-t39.txt | cut -c1-110
echo "ab $(( $(date +%s) - t0 )) s"
sed -i 's/, "3.9.")/)/' src/mlakit/kernels/decode_split_plan.py
