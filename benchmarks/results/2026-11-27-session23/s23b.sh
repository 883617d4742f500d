#!/usr/bin/env bash
# Session 23, call b: the 16-head two-token decode, kernel by kernel (split pass, combine) against its graph replay,
# bf16 pages, fp8 pages (fp16 MMAs) and fp8 with e4m3 scores planned with the batch's cached tokens.
set -uo pipefail
cd benchmarks/experiments
CASES="16,64,4096,2 16,16,16384,2 16,64,ragged,2 16,32,4096,2 16,128,16384,2 16,64,4096,1"
FP8=$(for c in $CASES; do echo -n "$c,fp8_e4m3 "; done)
export PYTHONPATH=../../src:.
timeout 170 python decode_kernel_breakdown.py $CASES > $OUT/breakdown-bf16.txt 2>&1
timeout 170 python decode_kernel_breakdown.py $FP8 > $OUT/breakdown-fp8.txt 2>&1
timeout 170 python decode_kernel_breakdown.py --e4m3-scores --hinted $FP8 > $OUT/breakdown-fp8-e4m3-hinted.txt 2>&1
cat $OUT/breakdown-*.txt
