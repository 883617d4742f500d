#!/usr/bin/env bash
# Session 20, call 4: v73a (warpgroup 0 hands P0' over while its P0 . V0_L runs; 16-bit pages) decode GPU tests
# (HEAD's tests, build/dev/head20), then its A/B against HEAD (build/dev/v73base), two rounds, clean L2.
# carry: build/dev/s20d.sh build/dev/s18b.sh build/dev/v73base build/dev/v73a build/dev/head20
cd "$(dirname "$0")/../.."
root=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
(cd build/dev/head20 && PYTHONPATH=$root/build/dev/v73a/src timeout 200 python -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_triton_decode_gpu.py 2>&1 | tail -4) | tee $OUT/tests.txt
TEST_S=1 ROUNDS=2 TREES="v73base v73a" \
  CASES="128,64,4096,1 128,64,4096,2 128,64,16384,2 128,64,ragged,1 128,64,1024,1 16,64,4096,1 128,64,4096,2,fp8_e4m3" \
  bash build/dev/s18b.sh
