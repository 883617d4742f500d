#!/usr/bin/env bash
# v88 (equal shares built by the plan kernel, every kernel reading its split's KV range from the plan's items):
# the GPU decode tests in four concurrent shards (the new share-plan tests among them), then `setting_ab.py`
# EQUAL_SHARES off / on, interleaved in one process, flushed L2, on the batches the CPU model gives shares and a few
# it does not (their outputs must be identical, their times level).
set -uo pipefail
R=$OUT/s26d
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
S=benchmarks/experiments/gpu_test_shard.sh
T=tests/test_triton_decode_gpu.py
$S $R narrow 330 $T -k "narrow or e4m3 or fp8" &
$S $R heads 330 $T -k "not (narrow or e4m3 or fp8) and heads_and_draft" &
$S $R plans 330 $T -k "not (narrow or e4m3 or fp8) and not heads_and_draft" &
$S $R fuzz 330 tests/test_fuzz_attention.py &
wait
CASES="128,40,8192,2 128,24,16384,2 128,24,16384,1 128,32,~16384,2 128,12,32768,2 128,40,4096,2 128,24,4096,2
 128,48,4096,1 128,40,8192,2,fp8_e4m3 128,24,16384,1,fp8_e4m3 128,64,~4096,2 128,64,16384,2 128,128,4096,1 64,40,8192,2"
(cd benchmarks/experiments && PYTHONPATH=../../src:. timeout $((585 - SECONDS)) python setting_ab.py \
  decode_split_plan.EQUAL_SHARES off=False on=True -- $CASES > $R/shares-ab.txt 2>&1
 echo "rc $? after ${SECONDS}s" >> $R/shares-ab.txt)
grep -a " us (" $R/shares-ab.txt; grep -a "splits" $R/shares-ab.txt | cut -c1-150; tail -n 2 $R/tests-*.txt
