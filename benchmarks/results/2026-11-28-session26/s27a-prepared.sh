#!/usr/bin/env bash
# Prepared for the next session (not run): the GPU tests v88 did not see to the end (NOTES.md "v88"), each alone on the
# GPU, one after another, with their durations: the two one-token share-plan tests (EQUAL_SHARES set by the test
# itself), the two merge tests and the wide draft shape that shared s26f's GPU with them; the share tests at two
# tokens again for their times, one planned for 32 SMs; then the new test that every Hopper kernel reads its split's
# range from the plan.
# If all pass, set `decode_split_plan.EQUAL_SHARES = True` (README "The split plan", NOTES "v88"); a test still
# running at its limit is a hang to find before that (py-spy is not on the image: the limit's SIGINT makes pytest
# print the whole stack it was in, --full-trace).
set -uo pipefail
R=$OUT/s27a
mkdir -p $R
T=tests/test_triton_decode_gpu.py
for test in "test_equal_share_plans_at_128_heads[bf16-lengths2-1-132]" \
    "test_equal_share_plans_at_128_heads[fp8_e4m3-lengths3-1-132]" \
    "test_persistent_kernel_merges_its_splits_and_leaves_its_counters_at_zero[16-1-15-bf16-512-64]" \
    "test_persistent_kernel_merges_its_splits_and_leaves_its_counters_at_zero[64-3-5-bf16-512-64]" \
    "test_heads_and_draft_lengths[256-32-128-8]" "test_equal_share_plans_at_128_heads[bf16-lengths0-2-132]" \
    "test_equal_share_plans_at_128_heads[fp8_e4m3-lengths1-2-132]" \
    "test_equal_share_plans_at_128_heads[bf16-lengths4-2-32]" \
    "test_hopper_kernels_read_each_splits_kv_range_from_the_plan"; do
  if [ $SECONDS -gt 430 ]; then echo "== $test: skipped (call's time)" >> $R/tests-alone.txt; continue; fi
  start=$SECONDS
  PYTHONPATH=src timeout -s INT -k 20 150 python -m pytest -q -p no:cacheprovider -m gpu --durations=2 --full-trace \
    "$T::$test" > "$R/one.txt" 2>&1
  echo "== $test: rc $? after $((SECONDS - start))s" >> $R/tests-alone.txt
  tail -n 60 "$R/one.txt" >> $R/tests-alone.txt
done
grep "^== " $R/tests-alone.txt
