#!/usr/bin/env bash
# Prepared for the next session (not run: this session's device time was spent): v98, equal shares (uniform and
# ragged) only where the plan is told the seesaw's pages, and v96's share-only combine only behind such plans.
# (1) GPU tests: the share / ragged / merge tests (the v96 test has a plan made without a page size, which must launch
# no combine); (2) EQUAL_SHARES off / on as s33g: pages of 16 / 32 should now be level (no shares either way), the
# seesaw's share plans as before (-7 to -15%; the benchmark's plans pass the cache's page size); (3) v96's off / on on
# a plan that may share against one that may not is covered by (1); (4) below.
set -uo pipefail
R=$OUT/s34a
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout -s INT -k 20 280 python -m pytest -q -rf -p no:cacheprovider tests/test_triton_decode_gpu.py \
  tests/test_decode_share_plan.py -k "share or ragged or merge" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 3 $R/tests.txt
timeout 120 python benchmarks/experiments/setting_ab.py decode_split_plan.EQUAL_SHARES off=False on=True -- \
  128,40,8192,2,bf16,16 128,40,4096,2,bf16,16 128,24,16384,1,bf16,32 128,40,8192,2,fp8_e4m3,16 \
  128,40,8192,2 128,24,16384,1 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-equal-shares.txt
tail -n 6 $R/ab-equal-shares.txt
# (4) Whether a ragged share plan (v97) merges its cut sequences faster in the seesaw than in the combine behind it
# (v96 moved a uniform share plan's merges out of the seesaw; at ragged q2 the combine's extra merges cancelled the
# seesaw's gain in s32g / s33b).
timeout 110 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE \
  off=False on=True -- 128,64,ragged,1 128,64,ragged,2 128,64,ragged,2,fp8_e4m3 128,40,4096,2 2>&1 \
  | grep -v "Warn\|_sync_debug" > $R/ab-share-merges-ragged.txt
tail -n 4 $R/ab-share-merges-ragged.txt
