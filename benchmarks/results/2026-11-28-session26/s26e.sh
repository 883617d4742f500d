#!/usr/bin/env bash
# v88, second call: the GPU decode tests s26d's shards did not reach in 330 s (s26e-tests.txt: each shard's last
# tests and their neighbours, the new share-plan tests among them) in two shards while FlashMLA builds on the CPU; then
# v88 beside FlashMLA (same process, clean L2): the batches that take equal shares and uneven batches (s26c's).
set -uo pipefail
R=$OUT/s26e
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
L=benchmarks/results/2026-11-28-session26/s26e-tests.txt
(timeout 400 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $R/build.txt 2>&1) &
S=benchmarks/experiments/gpu_test_shard.sh
$S $R rest-a 300 $(sed -n '1,17p' $L) &
$S $R rest-b 300 $(sed -n '18,$p' $L) &
wait
tail -n 2 $R/tests-*.txt
benchmarks/experiments/beside_flashmla.sh $R build/flashmla-src $((585 - SECONDS)) \
  "shares128=128,40,8192,2 128,24,16384,2 128,24,16384,1 128,32,~16384,2 128,40,4096,2 128,12,32768,2" \
  "uneven=128,64,~4096,2 128,64,~4096,1 128,128,~4096,1 128,64,~16384,1 16,64,~4096,1 16,64,~4096,2"
