#!/usr/bin/env bash
# Session 24, call c: split counts rounded down instead of to the nearest (a probe tree, build/dev/round: the plan's
# `ROUND_SPLITS_DOWN`), so that a uniform batch's programs never exceed what the GPU runs at once; fp8 default and
# bf16 cases at 16 and 128 heads, then 16-head fp8 with e4m3 scores and the hint. One archive back.
set -uo pipefail
mkdir -p $OUT/s24c
R=$OUT/s24c
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
PLAIN="16,48,4096,2,fp8_e4m3 16,40,4096,2,fp8_e4m3 16,100,4096,1,fp8_e4m3 16,48,4096,1,fp8_e4m3 16,24,8192,2,fp8_e4m3
 16,64,4096,1,fp8_e4m3 16,64,ragged,2,fp8_e4m3 16,100,4096,1 16,48,4096,2 128,48,4096,1 128,100,2048,1 128,64,4096,1
 128,64,ragged,2"
HINTED="16,48,4096,2,fp8_e4m3 16,40,4096,2,fp8_e4m3 16,24,8192,2,fp8_e4m3 16,100,4096,1,fp8_e4m3 16,64,4096,2,fp8_e4m3"
cd benchmarks/experiments
export PYTHONPATH=../../build/dev/round/src:.
timeout 330 python setting_ab.py decode_split_plan.ROUND_SPLITS_DOWN nearest=False down=True -- $PLAIN \
  > $R/round-plain.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/round-plain.txt
timeout $((575 - SECONDS)) python setting_ab.py decode_split_plan.ROUND_SPLITS_DOWN nearest=False down=True -- \
  --e4m3-scores --hinted $HINTED > $R/round-hinted.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/round-hinted.txt
tar -C $OUT -czf $OUT/s24c.tgz s24c && rm -rf $R
