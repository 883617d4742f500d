#!/usr/bin/env bash
# v88's equal shares for uniform batches were measured on the seesaw only: do they cost the grid kernels (a program a
# plan row: the cp.async kernel at pages of 16 or 32) what v97's ragged shares did (+36%)? EQUAL_SHARES off / on on the
# batches that take shares at 128 heads, pages of 16 and 32, with the seesaw (pages of 64) as control.
set -uo pipefail
R=$OUT/s33g
mkdir -p $R
export PYTHONPATH=src:benchmarks/experiments
timeout 170 python benchmarks/experiments/setting_ab.py decode_split_plan.EQUAL_SHARES off=False on=True -- \
  128,40,8192,2,bf16,16 128,40,4096,2,bf16,16 128,24,16384,1,bf16,32 128,40,8192,2,fp8_e4m3,16 \
  128,40,8192,2 128,24,16384,1 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-equal-shares-grid-kernels.txt
tail -n 6 $R/ab-equal-shares-grid-kernels.txt
