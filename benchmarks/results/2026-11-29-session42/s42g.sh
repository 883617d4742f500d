#!/usr/bin/env bash
# Forty-second session, call 2 of a pair (s42c.sh first, carry ["build/t39a"]; this one carry ["build/t39b"]): with
# "3.9." in SHARE_PLAN_TRITONS, the share-plan batches under 3.6 and 3.9.0 in alternating processes, two rounds, clean
# L2 (s42d ran 3.9 on split counts).
set -uo pipefail
R=$OUT/s42g
mkdir -p $R /tmp/cache39
source benchmarks/experiments/with_packed_triton.sh build/t39a build/t39b
TRITON_CACHE_DIR=/tmp/cache39 timeout 280 benchmarks/experiments/ab_source_trees.sh 2 src $PACKED_TRITON:src -- \
  --case 128,64,ragged,2 --case 128,64,ragged,1 --case 128,40,8192,2 --backends triton --no-baseline --clean-l2 \
  > $R/ab-t36-t39-shares.txt 2>&1; echo "rc $?" >> $R/ab-t36-t39-shares.txt
grep -o "[a-z/:-]* round [12]: h128.*triton *[0-9.]* us" $R/ab-t36-t39-shares.txt
