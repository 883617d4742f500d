#!/usr/bin/env bash
# Session 25, call d: v87 (split counts of two or three waves where a unit's fixed cost pays for them,
# decode_split_plan.HOPPER_UNIT_COST_TILES). FlashMLA built (CPU) while the plan / split / hint / ragged / graph GPU
# tests run; then `setting_ab.py` (cost 0 = one wave, v86's plans, against 13), interleaved in one process, L2
# flushed; then the tree beside FlashMLA on the 128-head batches v87 changes (same process, clean L2).
set -uo pipefail
R=$OUT/s25d
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
(timeout 190 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $R/build.txt 2>&1) &
PYTHONPATH=src timeout 190 python -m pytest -q -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "not (narrow or e4m3 or fp8) and (split or plan or hint or ragged or graph or wide)" > $R/tests-plans.txt 2>&1
echo "rc $? after ${SECONDS}s" >> $R/tests-plans.txt
wait
CASES="128,24,16384,2 128,24,16384,1 128,40,8192,2 128,12,32768,2 64,24,16384,2 128,24,16384,2,fp8_e4m3 128,64,16384,2"
(cd benchmarks/experiments && PYTHONPATH=../../src:. timeout 130 python setting_ab.py \
  decode_split_plan.HOPPER_UNIT_COST_TILES one_wave=0 cost13=13 -- $CASES > $R/units.txt 2>&1
 echo "rc $? after ${SECONDS}s" >> $R/units.txt)
benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src $((400 - SECONDS)) \
  "v87=128,24,16384,2 128,40,8192,2 128,24,16384,1"
