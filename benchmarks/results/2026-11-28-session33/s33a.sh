#!/usr/bin/env bash
# Prepared for the next session (not run: this session's device time is spent): v97, equal shares for ragged batches.
# Before the call, on the host: git apply benchmarks/experiments/patches/v97-ragged-equal-shares.diff (on b395738 or
# later; no carry). (1) GPU tests: the new ragged share plans (seesaw, cp.async at page 16, bf16 / fp8, split
# ceilings 2, 3, 6), the share, persistent-kernel and merge tests; (2) RAGGED_EQUAL_SHARES off / on (off is main
# exactly: the plan's rows are enlarged only with it on) on the ragged batches, pages of 16 (the cp.async kernel, whose
# grid has a program per plan row), 16 heads (not taken: level expected) and uniform controls.
set -uo pipefail
R=$OUT/s33a
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout -s INT -k 20 220 python -m pytest -q -rf -p no:cacheprovider tests/test_triton_decode_gpu.py \
  tests/test_decode_share_plan.py -k "share or ragged or persistent or merge or kv_range or other_lengths" \
  > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 3 $R/tests.txt
timeout 320 python benchmarks/experiments/setting_ab.py decode_split_plan.RAGGED_EQUAL_SHARES off=False on=True -- \
  128,64,ragged,1 128,64,ragged,2 128,64,ragged,1,fp8_e4m3 128,64,ragged,2,fp8_e4m3 128,64,ragged,1,bf16,16 \
  128,64,4096,2,bf16,16 16,64,ragged,1 128,64,4096,2 128,64,1024,2 2>&1 | grep -v "Warn\|_sync_debug" \
  > $R/ab-v97.txt
tail -n 9 $R/ab-v97.txt
