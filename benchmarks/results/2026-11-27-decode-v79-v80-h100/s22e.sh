#!/usr/bin/env bash
# Session 22, call e: v81 (the narrow kernel's 32-row tile chosen by a host hint of the batch's cached tokens):
# GPU tests, then the e4m3 A/B with the hinted plan beside the unhinted one (16 heads, two query tokens).
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/device.txt
PYTHONPATH=src timeout 330 python -m pytest -q -p no:cacheprovider tests/test_triton_decode_gpu.py tests/test_l2_evict_first.py \
  tests/test_compat_flashinfer_gpu.py > $OUT/tests-v81.txt 2>&1
echo "tests rc $?" >> $OUT/tests-v81.txt
PYTHONPATH=src:benchmarks/experiments timeout 240 python benchmarks/experiments/e4m3_scores_ab.py --json $OUT/v81-wide-tile-ab.json \
  16,128,16384,2 16,64,4096,2 16,16,16384,2 16,64,ragged,2 16,32,4096,2 16,256,256,2 16,64,1024,2 16,16,1024,2 \
  16,1,16384,2 > $OUT/v81-wide-tile-ab.txt 2>&1
echo "ab rc $?" >> $OUT/v81-wide-tile-ab.txt
