#!/usr/bin/env bash
# v92 (the next unit's query rows loaded by warpgroup 0 right after its tile loop, the output staged in KV stage 0):
# the seesaw's multi-unit GPU tests on the working tree (v92), then HEAD (f27504f, build/dev/head) against v92 in
# alternating processes, clean L2. Host: mkdir -p build/dev/head && git archive f27504f src | tar -x -C build/dev/head;
# carry ["build/dev"].
set -uo pipefail
R=$OUT/s29f
mkdir -p $R
timeout -s INT -k 20 280 python -m pytest -q -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "preload or prefetch or snake or persistent" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 4 $R/tests.txt
timeout 280 benchmarks/experiments/ab_source_trees.sh 2 build/dev/head/src src -- \
  --case 128,64,1024,2,bf16,64 --case 128,64,1024,1,bf16,64 --case 128,128,4096,1,bf16,64 --case 128,64,4096,2,bf16,64 \
  --case 128,64,ragged,2,bf16,64 --case 128,64,4096,1,fp8_e4m3,64 --case 128,64,1024,2,fp8_e4m3,64 \
  --backends triton --no-baseline --clean-l2 > $R/ab-v92.txt 2>&1
echo "ab rc $?" >> $R/ab-v92.txt
grep "round\|rc" $R/ab-v92.txt | cut -c1-100
