#!/usr/bin/env bash
# Session 20, call 5: the in-kernel merge's block size (the timeline: 9-13 us a merge, 18-21 us a program on the
# ragged batch). m128s4: 128-column blocks, 4 splits a step; m128s2: 128 columns, 2 splits. Merge GPU tests on
# m128s4 (HEAD's tests), then A/B against HEAD (build/dev/v73base), two rounds, clean L2.
# carry: build/dev/s20e.sh build/dev/s18b.sh build/dev/v73base build/dev/m128s4 build/dev/m128s2 build/dev/head20
cd "$(dirname "$0")/../.."
root=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
(cd build/dev/head20 && PYTHONPATH=$root/build/dev/m128s4/src timeout 150 python -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_triton_decode_gpu.py -k "merge or ragged or split" 2>&1 | tail -4) | tee $OUT/tests.txt
TEST_S=1 ROUNDS=2 TREES="v73base m128s4 m128s2" \
  CASES="128,64,ragged,1 128,64,ragged,2 16,64,ragged,1 128,32,4096,1 128,16,4096,2 128,64,1024,1 128,64,ragged,1,fp8_e4m3" \
  bash build/dev/s18b.sh
