#!/usr/bin/env bash
# v87's changed counts that were not measured (NOTES.md "v87", after the
# review), `setting_ab.py` with the unit cost at 0 (one wave) and 13, interleaved in one process, flushed L2; then the
# GPU tests v87 has not met: the new multi-wave wiring test, the narrow / e4m3 / fp8 decode shard and the fuzz tests,
# in concurrent shards (`gpu_test_shard.sh`).
set -uo pipefail
R=$OUT/s26a
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
CASES="128,40,4096,1 128,40,4096,2 128,48,4096,2 128,96,4096,1 128,48,16384,1 128,24,32768,1 64,40,4096,2 64,96,4096,2
 128,40,4096,2,fp8_e4m3 128,24,16384,2"
(cd benchmarks/experiments && PYTHONPATH=../../src:. timeout 200 python setting_ab.py \
  decode_split_plan.HOPPER_UNIT_COST_TILES one_wave=0 cost13=13 -- $CASES > $R/units-unmeasured.txt 2>&1
 echo "rc $? after ${SECONDS}s" >> $R/units-unmeasured.txt)
LEFT=$((570 - SECONDS))
benchmarks/experiments/gpu_test_shard.sh $R decode-narrow $LEFT tests/test_triton_decode_gpu.py \
  -k "narrow or e4m3 or fp8 or several_waves" &
benchmarks/experiments/gpu_test_shard.sh $R fuzz $LEFT tests/test_fuzz_attention.py &
wait
grep -a " us (" $R/units-unmeasured.txt; tail -n 2 $R/tests-*.txt
