#!/usr/bin/env bash
# v104 at its threshold of 32 tiles a unit: the 128-head warm-up test again, now naming the kernel variant a serving
# step compiled that the warm-up had not (s44b: one of them), while FlashMLA 9241ae3 builds; then issue 23's 128-head
# bf16 cases beside FlashMLA in one process (clean L2; our plans told the batch's cached tokens, as `mlakit bench
# decode` now tells them).
set -uo pipefail
R=$OUT/s44c
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R warmup 220 tests/test_warmup.py -v -k "no_step_compiles and bf16-1-1" &
timeout 300 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 12 --no-fp16 > $R/build.txt 2>&1
echo "build $(( $(date +%s) - t0 )) s: $(tail -1 $R/build.txt)"
wait
tail -n 2 $R/tests-warmup.txt; grep "^E " $R/tests-warmup.txt | head -8
echo "tests $(( $(date +%s) - t0 )) s"
timeout 330 benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src 320 \
  "q2=128,64,1024,2 128,64,2048,2 128,64,4096,2 128,40,8192,2 128,64,ragged,2" \
  "q1=128,64,1024,1 128,64,4096,1 128,64,ragged,1"
for f in q2 q1; do grep " us " $R/$f.txt | cut -c1-60,125-160; done
echo "total $(( $(date +%s) - t0 )) s"
