#!/usr/bin/env bash
# Prepared for the next session (not run): v94, the narrow fp8 kernel with two warpgroups a program under e4m3 scores
# (experiments/patches/v94-narrow-two-warpgroups-e4m3.diff; apply it to the working tree before the call, `git apply`).
# (1) its GPU tests over e4m3 scores and the narrow kernel (the e4m3 ones run it: E4M3_WARPGROUPS = 2 in the patch);
# (2) E4M3_WARPGROUPS 1 / 2 in one process (outputs compared; flushed L2): hinted 32-row tiles, unhinted 16-row ones,
# the ragged batch, batch 1, 32 heads; (3) fp8 against bf16 at 16 heads (e4m3_scores_ab.py) for the >= 1.6x target.
set -uo pipefail
R=$OUT/s31a
mkdir -p $R
timeout 240 python -m pytest -q -x tests/test_triton_decode_gpu.py -k "e4m3 or narrow" -p no:cacheprovider \
  > $R/tests.txt 2>&1
echo "tests rc $?"; tail -n 2 $R/tests.txt
PYTHONPATH=src:benchmarks/experiments timeout 120 python benchmarks/experiments/setting_ab.py \
  hopper_narrow_decode.E4M3_WARPGROUPS w1=1 w2=2 -- --e4m3-scores --hinted \
  16,64,4096,2,fp8_e4m3 16,128,4096,2,fp8_e4m3 16,64,ragged,2,fp8_e4m3 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-hinted.txt
tail -n 3 $R/ab-hinted.txt
PYTHONPATH=src:benchmarks/experiments timeout 120 python benchmarks/experiments/setting_ab.py \
  hopper_narrow_decode.E4M3_WARPGROUPS w1=1 w2=2 -- --e4m3-scores \
  16,64,4096,1,fp8_e4m3 16,16,4096,1,fp8_e4m3 16,1,16384,1,fp8_e4m3 16,64,ragged,1,fp8_e4m3 32,64,4096,1,fp8_e4m3 \
  2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-unhinted.txt
tail -n 5 $R/ab-unhinted.txt
PYTHONPATH=src:benchmarks/experiments timeout 100 python benchmarks/experiments/e4m3_scores_ab.py \
  --json $R/fp8-h16.json 16,64,4096,2 16,128,4096,2 > $R/fp8-h16.txt 2>&1
grep -v "Warn\|_sync_debug" $R/fp8-h16.txt | tail -n 4
