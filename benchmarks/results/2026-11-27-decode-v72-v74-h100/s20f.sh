#!/usr/bin/env bash
# Session 20, call 6: the package split (ef17373) + v74 (the merge in 128-column blocks, 2 partials a step) on the GPU:
# decode GPU tests, the other decode-path GPU tests, a third A/B round against HEAD before the split (v73base),
# then `make demo` on the GPU.
# carry: build/dev/s20f.sh build/dev/s18b.sh build/dev/v73base build/dev/pkg
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout 220 python -m pytest -q -n 8 tests/test_triton_decode_gpu.py 2>&1 | tail -3 | tee $OUT/tests.txt
timeout 150 python -m pytest -q -n 8 tests/test_graphs.py tests/test_api.py tests/test_gpu.py \
  tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py 2>&1 | tail -3 | tee -a $OUT/tests.txt
TEST_S=1 ROUNDS=1 TREES="v73base pkg" \
  CASES="128,64,ragged,1 128,64,ragged,2 128,64,ragged,1,fp8_e4m3 16,64,ragged,1 128,64,4096,1" bash build/dev/s18b.sh
echo "== demo"
timeout 150 make demo 2>&1 | tail -6 | tee $OUT/demo.txt
