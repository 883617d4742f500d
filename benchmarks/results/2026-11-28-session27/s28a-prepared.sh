#!/usr/bin/env bash
# Prepared for the next session (not run): v89, the seesaw loading the next unit's first two tiles under this unit's
# last pair (patches/v89-seesaw-next-unit-tiles-under-last-pair.diff; NOTES.md "v89 (prepared, not run)"), call 1 of
# 2: its GPU decode tests over the seesaw's several units a program (persistent plans, fixed counts in snake order,
# shares, waves, ranges, graphs, page sizes and kv dtypes, 128-head e4m3 and reference checks; 88 tests, ~5.6 s each,
# compile-bound), one process. s28b-prepared.sh then times it.
# On the host first (build/ is ignored; carry build/dev in the device call):
#   rm -rf build/dev && mkdir -p build/dev/base build/dev/v89
#   git archive HEAD src | tar -x -C build/dev/base && git archive HEAD src benchmarks/experiments | tar -x -C build/dev/v89
#   git apply --directory=build/dev/v89 benchmarks/experiments/patches/v89-seesaw-next-unit-tiles-under-last-pair.diff
set -uo pipefail
R=$OUT/s28a
mkdir -p $R
# pytest puts pyproject's `pythonpath = ["src"]` ahead of PYTHONPATH (so s22b.sh's v80 tests ran HEAD's package): the
# ini option is overridden to test v89's tree (checked on the host: the tests then import build/dev/v89/src/mlakit).
K="persistent or share or waves or kv_range or graph or seesaw or 128_heads or forced_split or page_sizes"
timeout -s INT -k 20 540 python -m pytest -q -rf -p no:cacheprovider -m gpu -o pythonpath=build/dev/v89/src \
  tests/test_triton_decode_gpu.py -k "$K or (e4m3 and 128) or (hopper_kernel_matches and 128)" > $R/tests-v89.txt 2>&1
echo "rc $?" >> $R/tests-v89.txt
tail -3 $R/tests-v89.txt
