#!/usr/bin/env bash
# Session 32, seventh call (no carry): a probe, equal shares for ragged batches (decode_split_plan.RAGGED_EQUAL_SHARES:
# taken wherever they fit, no estimate; the plan's rows 4x to hold a share's short sequences in rounds of their own),
# with v96 (their merges by the combine). setting_ab.py: graph replay, flushed L2, interleaved, outputs compared.
set -uo pipefail
R=$OUT/s32g
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout 250 python benchmarks/experiments/setting_ab.py decode_split_plan.RAGGED_EQUAL_SHARES off=False on=True \
  -- 128,64,ragged,1 128,64,ragged,2 128,64,ragged,1,fp8_e4m3 16,64,ragged,1 16,64,ragged,2 128,64,4096,2 2>&1 \
  | grep -v "Warn\|_sync_debug" > $R/ab-ragged-shares.txt
tail -n 6 $R/ab-ragged-shares.txt
