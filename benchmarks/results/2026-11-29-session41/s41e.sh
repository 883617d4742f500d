#!/usr/bin/env bash
# Under Triton 3.8.0 (packed; carry ["build/triton38"]) with equal shares (SHARE_PLAN_TRITONS now holds 3.8), on the
# warm machine s41d built FlashMLA on: issue 23's bf16 cases beside FlashMLA 9241ae3 in one process (clean L2), as
# s39b measured them under 3.7.1.
set -uo pipefail
R=$OUT/s41e
mkdir -p $R /tmp/cache38
source benchmarks/experiments/with_packed_triton.sh build/triton38
PYTHONPATH=$PACKED_TRITON:src python -c "import triton; print('triton', triton.__version__, triton.__file__)"
TRITON_CACHE_DIR=/tmp/cache38 MLAKIT_SRC=$PACKED_TRITON:src timeout 540 benchmarks/experiments/beside_flashmla.sh \
  $R build/flashmla-src 530 \
  "ragged=128,64,ragged,1 128,64,ragged,2 16,64,ragged,1 16,64,ragged,2" \
  "q2=128,64,4096,2 128,128,4096,2 128,64,16384,2 128,64,1024,2 128,24,16384,2 128,40,8192,2" \
  "q1=128,64,1024,1 128,64,4096,1 128,128,4096,1 16,16,4096,1 16,128,1024,2 16,16,1024,2"
for f in ragged q2 q1; do grep " us " $R/$f.txt | cut -c1-60,125-160; grep MISSED $R/$f.txt; done
