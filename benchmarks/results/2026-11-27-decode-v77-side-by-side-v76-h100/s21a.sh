#!/usr/bin/env bash
# Session 21, call 1: v77 (src: each warpgroup merges its half of a split sequence's partials inside the
# warp-specialized region) decode GPU tests, then A/B against HEAD b70099e (build/dev/base) and v77 with
# RAGGED_PROGRAMS 4 (build/dev/v77r4), two rounds, clean L2.
# carry: build/dev
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
PYTHONPATH=src timeout 230 python -m pytest -q -n 8 tests/test_triton_decode_gpu.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
C=""; for c in 128,64,ragged,1 128,64,ragged,2 128,64,ragged,1,fp8_e4m3 16,64,ragged,1 16,64,ragged,2 \
  64,64,ragged,2 128,64,4096,1 128,64,4096,2; do C="$C --case $c"; done
timeout 330 bash benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src src build/dev/v77r4/src -- \
  $C --backends triton --no-baseline --clean-l2 2>&1 | tee $OUT/ab-v77.txt
