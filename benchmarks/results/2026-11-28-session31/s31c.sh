#!/usr/bin/env bash
# v95, continued: the GPU tests s31b's limit cut off (in-kernel merges, snake order, plans for other lengths, several
# waves, equal shares, KV ranges) and a few more over splits; then the split plans beside FlashMLA 9241ae3 in one
# process (clean L2). Carry ["build/flashmla-src"].
set -uo pipefail
R=$OUT/s31c
mkdir -p $R
timeout -s INT -k 20 200 python -m pytest -q -x -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "merges or snake or other_lengths or several_waves or equal_share or kv_range or 128_heads_with or split_plan_in_a_cuda_graph" \
  > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 3 $R/tests.txt
timeout 370 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 360 \
  "split=128,24,16384,2 128,16,16384,1 128,40,4096,2 128,40,8192,2 128,64,ragged,1 128,64,ragged,2 128,1,16384,1" \
  "h16=16,64,ragged,1 16,64,ragged,2 16,16,4096,1"
for f in split h16; do grep -E "MISSED|met |x " $R/$f.txt | tail -n 12; done
