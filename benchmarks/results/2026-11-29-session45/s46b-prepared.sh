#!/usr/bin/env bash
# Prepared in the forty-fifth session (not run), carry ["build/triton37"]: the decode GPU tests no call of that session
# reached under Triton 3.7.1 (not-reached-t371.txt: 21 ids, one of them passed in s45d), seven shards of three.
set -uo pipefail
R=$OUT/s46b
mkdir -p $R /tmp/cache37
t0=$(date +%s)
source benchmarks/experiments/with_packed_triton.sh build/triton37
export TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src
python -c "import triton; print('triton', triton.__version__)"
ids=benchmarks/results/2026-11-29-session45/not-reached-t371.txt
for s in 0 1 2 3 4 5 6; do
  timeout -s INT -k 10 480 python -m pytest -q -rA -p no:cacheprovider -m gpu $(awk -v s=$s 'NR % 7 == s' $ids) \
    > $R/tests-$s.txt 2>&1 &
done
wait
cat $R/tests-*.txt | grep -c "^PASSED"; grep -h "^FAILED\|^E  \|passed\|failed" $R/tests-*.txt | head -20
echo "total $(( $(date +%s) - t0 )) s"
