#!/usr/bin/env bash
# v97 with the page-size hint (a ragged batch takes equal shares only where the plan is told its pages are the
# seesaw's): (1) GPU tests: the share / ragged / persistent / merge tests, the FlashMLA and FlashInfer drop-ins, warm-up
# and CUDA graphs (which now plan with the cache's page size); (2) RAGGED_EQUAL_SHARES off / on through the benchmark's
# plans (which pass the cache's page size): pages of 16 should now be level; (3) v96's eager host cost
# (SHARE_MERGES_BY_COMBINE off / on alternating; the README's host table predates the extra launch).
set -uo pipefail
R=$OUT/s33b
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout -s INT -k 20 300 python -m pytest -q -rf -p no:cacheprovider tests/test_triton_decode_gpu.py \
  tests/test_decode_share_plan.py tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py \
  tests/test_warmup.py tests/test_graphs.py \
  -k "share or ragged or persistent or merge or kv_range or other_lengths or compat or flash or warm or graph" \
  > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 3 $R/tests.txt
timeout 120 python benchmarks/experiments/setting_ab.py decode_split_plan.RAGGED_EQUAL_SHARES off=False on=True -- \
  128,64,ragged,1 128,64,ragged,2 128,64,ragged,1,fp8_e4m3 128,64,ragged,2,fp8_e4m3 128,64,ragged,1,bf16,16 \
  16,64,ragged,1 128,64,4096,2 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-v97.txt
tail -n 7 $R/ab-v97.txt
export PYTHONPATH=src:benchmarks/experiments:tests
timeout 150 python benchmarks/experiments/host_cost_setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE \
  off=False on=True -- decode,128,64,4096,2 decode,128,64,1024,2 decode,128,1,1024,1 2>&1 \
  | grep -v "Warn\|_sync_debug" > $R/host-v96.txt
cat $R/host-v96.txt
