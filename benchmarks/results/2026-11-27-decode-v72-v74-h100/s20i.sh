#!/usr/bin/env bash
# Session 20, call 9: v76 (ragged batches whose sequences span 4+ row tiles aim at 4x the programs) decode GPU tests
# (src = v76), then A/B against HEAD (v75base), two rounds, clean L2.
# carry: build/dev/s20i.sh build/dev/s18b.sh build/dev/v75base build/dev/v76
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python -m pytest -q -n 8 tests/test_triton_decode_gpu.py 2>&1 | tail -2 | tee $OUT/tests.txt
TEST_S=1 ROUNDS=2 TREES="v75base v76" \
  CASES="128,64,ragged,2 128,64,ragged,1 128,64,ragged,4 128,64,ragged,2,fp8_e4m3 64,64,ragged,2 16,64,ragged,2" \
  bash build/dev/s18b.sh
