#!/usr/bin/env bash
# Session 32, fifth call (no carry): v96, an equal-share plan's merges left to a combine launched behind the seesaw
# (dispatch.SHARE_MERGES_BY_COMBINE; the combine's 8-row programs merge only such a plan's partials, the seesaw every
# other plan's under a split ceiling of 4). GPU tests over merges, shares and the persistent kernel, then the A/B
# (setting_ab.py: graph replay, flushed L2, interleaved, outputs compared).
set -uo pipefail
R=$OUT/s32e
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout 260 python -m pytest -q -p no:cacheprovider tests/test_triton_decode_gpu.py tests/test_decode_share_plan.py \
  tests/test_triton_decode.py -k "share or merge or persistent or snake or combine" 2>&1 | tail -n 15 > $R/tests.txt
tail -n 4 $R/tests.txt
timeout 300 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE off=False on=True \
  -- 128,40,4096,2 128,40,8192,2 128,40,4096,2,fp8_e4m3 128,64,1024,2 128,64,4096,2 128,64,ragged,1 128,64,ragged,2 \
  128,24,16384,2 16,128,1024,2 128,128,1024,1 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-v96.txt
tail -n 10 $R/ab-v96.txt
