#!/usr/bin/env bash
# v88, third call: the GPU decode tests s26e's shards did not reach in 300 s (lines 13-17 and 31-34 of s26e-tests.txt:
# three of the four share-plan tests, the persistent kernel's counter / merge tests, two wide draft shapes), one to
# three a shard.
set -uo pipefail
R=$OUT/s26f
mkdir -p $R
L=benchmarks/results/2026-11-28-session26/s26e-tests.txt
S=benchmarks/experiments/gpu_test_shard.sh
$S $R share-fp8-q1 290 $(sed -n '13p' $L) &
$S $R share-bf16-q2 290 $(sed -n '31p' $L) &
$S $R share-bf16-q1 290 $(sed -n '32p' $L) &
$S $R persistent 290 $(sed -n '14,15p' $L) &
$S $R merges-heads 290 $(sed -n '16,17p;33,34p' $L) &
wait
tail -n 2 $R/tests-*.txt
