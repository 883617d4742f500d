#!/usr/bin/env bash
# Forty-fifth session, call 3, carry ["build/triton37"], on s45b's warm machine: the 58 decode GPU tests s45b's shards
# did not reach in 420 s (s45c-ids.txt: the tail of each shard, among them v103's and v104's tests), under Triton
# 3.7.1, four shards again, test names listed this time.
set -uo pipefail
R=$OUT/s45c
mkdir -p $R /tmp/cache37
t0=$(date +%s)
source benchmarks/experiments/with_packed_triton.sh build/triton37
export TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src
python -c "import triton; print('triton', triton.__version__)"
ids=benchmarks/results/2026-11-29-session45/s45c-ids.txt
for s in 0 1 2 3; do
  timeout -s INT -k 20 540 python -m pytest -q -rA -p no:cacheprovider -m gpu $(awk -v s=$s 'NR % 4 == s' $ids) \
    > $R/tests-$s.txt 2>&1 &
done
wait
cat $R/tests-*.txt | grep -c "^PASSED"; grep -h "^FAILED\|^E  \|passed\|failed" $R/tests-*.txt | head -20
echo "total $(( $(date +%s) - t0 )) s"
