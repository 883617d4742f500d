#!/usr/bin/env bash
# Prepared for the next session (not run): v90b, the next unit's prefetch addresses staged behind this unit's own loads
# (experiments/patches/v90b-stage-next-unit-behind-own-loads.diff; NOTES.md "v90b (prepared, not run)"). A review found
# that v90 stages them before the unit starts, so every unit's own loads wait for the next unit's plan entry, length and
# block-table entry (three dependent global loads), on ragged plans too, where nothing is prefetched.
# Host: mkdir -p build/dev/v90b && git archive HEAD src benchmarks/experiments | tar -x -C build/dev/v90b && \
#   git apply --directory=build/dev/v90b benchmarks/experiments/patches/v90b-stage-next-unit-behind-own-loads.diff
# carry ["build/dev"]. One call (~8 min): HEAD's new address test; v90b's prefetch, snake-order, 128-head e4m3 and
# persistent-kernel GPU tests over fp8 pages (16-bit kernels are unchanged by v90b; pytest's ini pythonpath overridden so they import v90b's tree); then in v90b's tree the
# prefetch on 16-bit pages (off by default: v90 lost 0.4-5% there, perhaps partly this stall) and on fp8 (on), each
# against none, one process, clean L2.
set -uo pipefail
R=$OUT/s29b
mkdir -p $R
timeout -s INT -k 20 60 python -m pytest -q -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "asks_for_the_units_rows" > $R/tests-head.txt 2>&1
echo "rc $?" >> $R/tests-head.txt
timeout -s INT -k 20 240 python -m pytest -q -rf -p no:cacheprovider -m gpu -o pythonpath=build/dev/v90b/src \
  tests/test_triton_decode_gpu.py -k "prefetch or ((snake or persistent or 128) and e4m3)" > $R/tests-v90b.txt 2>&1
echo "rc $?" >> $R/tests-v90b.txt
tail -2 $R/tests-head.txt $R/tests-v90b.txt
export PYTHONPATH=build/dev/v90b/src
timeout 150 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH_PAIRS_16BIT off=0 p1=1 -- \
  128,64,1024,2 128,128,4096,1 128,40,4096,2 128,64,4096,2 128,64,ragged,2 > $R/ab-16bit.txt 2>&1
echo "ab rc $?" >> $R/ab-16bit.txt
timeout 120 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH_PAIRS_FP8 off=0 p1=1 -- \
  128,64,4096,1,fp8_e4m3 128,128,4096,1,fp8_e4m3 128,64,4096,2,fp8_e4m3 128,64,ragged,2,fp8_e4m3 > $R/ab-fp8.txt 2>&1
echo "ab rc $?" >> $R/ab-fp8.txt
grep -h " us (\|rc" $R/ab-16bit.txt $R/ab-fp8.txt
