#!/usr/bin/env bash
# Session 27, call 4, on two GPUs (nvidia-h100-x2): the multi-GPU path after v87 / v88 (last run 2026-11-26): TP / DCP
# correctness at world 2 against one GPU, then the 128k DCP scaling rows at batch 1 and 16 while the deadline allows.
set -uo pipefail
python3 scripts/multi_gpu_run.py --deadline-s 420 --contexts 131072 --batches 1,16 --dcp-sizes 1,2 \
  --out $OUT/multi-gpu-2x.json --work-dir /tmp/mg > $OUT/multi-gpu-run.txt 2>&1
echo "rc $?" >> $OUT/multi-gpu-run.txt
tail -30 $OUT/multi-gpu-run.txt
