#!/usr/bin/env bash
# Session 20, call 1 (prepared in session 19): v72 (build/dev/v72/src = HEAD + benchmarks/experiments/patches/
# v72-seesaw-fewer-warpgroup-syncs.diff) swapped into src for the decode GPU tests (the padded-rows test is new),
# then its A/B against v71 (build/dev/v71/src = HEAD's src), two rounds, clean L2, bf16 and fp8.
# carry: build/dev/s18b.sh build/dev/s20a.sh build/dev/v71 build/dev/v72
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
cp src/mlakit/kernels/hopper_decode.py /tmp/hopper_decode_head.py
cp build/dev/v72/src/mlakit/kernels/hopper_decode.py src/mlakit/kernels/hopper_decode.py
timeout 200 python -m pytest -q -n 8 tests/test_triton_decode_gpu.py 2>&1 | tail -4 | tee $OUT/tests.txt
cp /tmp/hopper_decode_head.py src/mlakit/kernels/hopper_decode.py
TEST_S=1 ROUNDS=2 TREES="v71 v72" \
  CASES="128,64,4096,1 128,64,4096,2 128,64,16384,2 128,64,ragged,1 128,64,1024,1 16,64,4096,1 128,64,4096,2,fp8_e4m3" \
  bash build/dev/s18b.sh
