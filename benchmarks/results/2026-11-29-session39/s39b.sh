#!/usr/bin/env bash
# Under Triton 3.7.1 (packed; carry ["build/triton37"]), on the warm machine s39a built FlashMLA on: (1) diag38's plan
# (132 items expected) and the scan of what it compiled; (2) issue 23's bf16 cases beside FlashMLA 9241ae3 in one
# process (clean L2), as s35c measured them under 3.6, to give the standing under the Triton torch 2.13 pins.
set -uo pipefail
R=$OUT/s39b
mkdir -p $R /tmp/cache37 /tmp/dumps
source benchmarks/experiments/with_packed_triton.sh build/triton37
TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src python benchmarks/results/2026-11-29-session38/diag38.py \
  /tmp/dumps t37 2>&1 | tail -2 | tee $R/plan-t37.txt
PYTHONPATH=$PACKED_TRITON:src python scripts/gluon_compile_check.py --scan-cache /tmp/cache37 > $R/scan-t37.txt 2>&1
tail -n 1 $R/scan-t37.txt
PYTHONPATH=$PACKED_TRITON:src python -c "import triton; print('triton', triton.__version__, triton.__file__)"
TRITON_CACHE_DIR=/tmp/cache37 MLAKIT_SRC=$PACKED_TRITON:src timeout 450 benchmarks/experiments/beside_flashmla.sh \
  $R build/flashmla-src 440 \
  "q2=128,64,4096,2 128,128,4096,2 128,64,16384,2 128,64,1024,2 128,24,16384,2 128,40,8192,2" \
  "ragged=128,64,ragged,1 128,64,ragged,2 16,64,ragged,1 16,64,ragged,2" \
  "q1=128,64,1024,1 128,64,4096,1 128,128,4096,1 16,16,4096,1 16,128,1024,2 16,16,1024,2"
for f in q2 ragged q1; do grep " us " $R/$f.txt | cut -c1-60,125-160; grep MISSED $R/$f.txt; done
