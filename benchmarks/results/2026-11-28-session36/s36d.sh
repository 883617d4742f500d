#!/usr/bin/env bash
# The 23 GPU decode tests s36c's shards did not reach (s36d-ids.txt), on one H200.
set -uo pipefail
R=$OUT/s36d
mkdir -p $R
benchmarks/experiments/gpu_test_shard.sh $R rest 330 $(cat benchmarks/results/2026-11-28-session36/s36d-ids.txt)
tail -n 3 $R/tests-rest.txt
grep -h "^FAILED\|^ERROR" $R/tests-rest.txt | head
