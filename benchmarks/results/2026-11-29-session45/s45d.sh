#!/usr/bin/env bash
# Forty-fifth session, call 4, carry ["build/triton37"], on a cold machine: the 27 decode GPU tests s45b and s45c
# did not reach in their limits (s45d-ids.txt), under Triton 3.7.1, nine shards of three.
set -uo pipefail
R=$OUT/s45d
mkdir -p $R /tmp/cache37
t0=$(date +%s)
source benchmarks/experiments/with_packed_triton.sh build/triton37
export TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src
python -c "import triton; print('triton', triton.__version__)"
ids=benchmarks/results/2026-11-29-session45/s45d-ids.txt
for s in 0 1 2 3 4 5 6 7 8; do
  timeout -s INT -k 10 250 python -m pytest -q -rA -p no:cacheprovider -m gpu $(awk -v s=$s 'NR % 9 == s' $ids) \
    > $R/tests-$s.txt 2>&1 &
done
wait
cat $R/tests-*.txt | grep -c "^PASSED"; grep -h "^FAILED\|^E  \|passed\|failed" $R/tests-*.txt | head -20
echo "total $(( $(date +%s) - t0 )) s"
