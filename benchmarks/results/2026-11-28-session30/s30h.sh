#!/usr/bin/env bash
# v93 (the narrow kernel's next S^T issued under this tile's P . V, e4m3 scores): its GPU tests over e4m3 scores, then
# PIPELINED_SCORES off / on in one process (outputs compared, flushed L2), hinted 32-row tiles and unhinted 16-row ones.
set -uo pipefail
R=$OUT/s30h
mkdir -p $R
timeout 110 python -m pytest -q -x tests/test_triton_decode_gpu.py -k "e4m3" -p no:cacheprovider > $R/tests.txt 2>&1
echo "tests rc $?"; tail -n 2 $R/tests.txt
PYTHONPATH=src:benchmarks/experiments timeout 70 python benchmarks/experiments/setting_ab.py \
  hopper_narrow_decode.PIPELINED_SCORES off=False on=True -- --e4m3-scores --hinted \
  16,64,4096,2,fp8_e4m3 16,128,4096,2,fp8_e4m3 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-hinted.txt
tail -n 4 $R/ab-hinted.txt
PYTHONPATH=src:benchmarks/experiments timeout 50 python benchmarks/experiments/setting_ab.py \
  hopper_narrow_decode.PIPELINED_SCORES off=False on=True -- --e4m3-scores \
  16,64,4096,1,fp8_e4m3 16,64,ragged,2,fp8_e4m3 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-unhinted.txt
tail -n 4 $R/ab-unhinted.txt
