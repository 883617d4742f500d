#!/usr/bin/env bash
# Prepared for the next session (not run): v91, the share layout's two lane shifts by `tl.gather` in registers instead
# of a store / barrier / load / barrier round trip through global memory each
# (experiments/patches/v91-share-layout-lane-shifts-by-gather.diff; NOTES.md "v91 (prepared, not run)"). CPU: the
# plan tests pass under the interpreter (159), and the plan kernel compiles for sm_90 with triton 3.6. Here: the share
# plans' GPU tests on v91's tree, then the plan kernel's own time, HEAD against v91 (shares off / on per case).
# Host: rm -rf build/dev && for t in base v91; do mkdir -p build/dev/$t && git archive HEAD src benchmarks/experiments |
#   tar -x -C build/dev/$t; done && git apply --directory=build/dev/v91 \
#   benchmarks/experiments/patches/v91-share-layout-lane-shifts-by-gather.diff
# carry ["build/dev"].
set -uo pipefail
R=$OUT/s29d
mkdir -p $R
timeout -s INT -k 20 200 python -m pytest -q -rf -p no:cacheprovider -o pythonpath=build/dev/v91/src \
  tests/test_decode_share_plan.py tests/test_triton_decode_gpu.py -k "share" > $R/tests-v91.txt 2>&1
echo "rc $?" >> $R/tests-v91.txt
tail -2 $R/tests-v91.txt
for tree in base v91; do
  echo "== $tree" >> $R/plan-time.txt
  (cd build/dev/$tree && PYTHONPATH=src:benchmarks/experiments timeout 120 python benchmarks/experiments/plan_kernel_time.py \
    128,40,4096,2 128,24,16384,1 128,40,8192,2 128,64,4096,2 >> $OUT/s29d/plan-time.txt 2>&1)
done
grep -v Warning $R/plan-time.txt
