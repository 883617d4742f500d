#!/usr/bin/env bash
# Session 21, call 9: v78 (src: the next unit's Q and first two tiles requested before this unit's merge) decode GPU
# tests, then A/B against HEAD 82c2832 (build/dev/base78), two rounds, clean L2.
# carry: build/dev
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
PYTHONPATH=src timeout 200 python -m pytest -q -n 8 tests/test_triton_decode_gpu.py tests/test_l2_evict_first.py > $OUT/tests.txt 2>&1
tail -2 $OUT/tests.txt
C=""; for c in 128,64,ragged,1 128,64,ragged,2 128,64,ragged,1,fp8_e4m3 16,64,ragged,1 128,64,1024,1 \
  128,64,4096,1 128,64,4096,2; do C="$C --case $c"; done
timeout 300 bash benchmarks/experiments/ab_source_trees.sh 2 build/dev/base78/src src -- \
  $C --backends triton --no-baseline --clean-l2 2>&1 | tee $OUT/ab-v78.txt
