#!/usr/bin/env bash
# Session 22, call a: the equal-share probe (shares tree) and the range fields' own cost (base vs shares, default plans).
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
PYTHONPATH=build/dev/shares/src:benchmarks/experiments timeout 420 python benchmarks/experiments/share_plan_probe.py \
  128,64,16384,2 128,128,4096,2 128,16,16384,2 128,64,4096,2 128,128,16384,2 128,16,4096,2 \
  128,64,16384,1 128,128,16384,1 128,128,4096,1 128,64,ragged,1 128,64,ragged,2 > $OUT/probe.txt 2>&1
echo "probe rc $?" >> $OUT/probe.txt
timeout 150 benchmarks/experiments/ab_source_trees.sh 1 build/dev/base/src build/dev/shares/src -- \
  --case 128,64,4096,1,bf16,64 --case 128,64,ragged,2,bf16,64 --backends triton --no-baseline --clean-l2 > $OUT/ab-fields.txt 2>&1
echo "ab rc $?" >> $OUT/ab-fields.txt
