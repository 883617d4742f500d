#!/usr/bin/env bash
# Session 22, call d: v79's share plans with the merges left to the combine kernel (what of a cut's cost is the merge).
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/device.txt
PYTHONPATH=build/dev/shares/src:benchmarks/experiments timeout 400 python benchmarks/experiments/share_plan_probe.py \
  128,64,16384,2 128,128,4096,1 128,128,16384,2 128,64,ragged,1 128,64,ragged,2 > $OUT/probe-combine.txt 2>&1
echo "probe rc $?" >> $OUT/probe-combine.txt
