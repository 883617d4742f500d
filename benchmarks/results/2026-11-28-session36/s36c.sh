#!/usr/bin/env bash
# The whole GPU decode test file (tests/test_triton_decode_gpu.py, 235 tests), which no call had run to its end on one
# GPU: its test ids split in two alternating halves, one shard a GPU (2 x H200), one line a test.
set -uo pipefail
R=$OUT/s36c
mkdir -p $R
PYTHONPATH=src python -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/test_triton_decode_gpu.py \
  | grep "::" > $R/ids.txt
awk 'NR % 2 == 1' $R/ids.txt > $R/ids-0.txt
awk 'NR % 2 == 0' $R/ids.txt > $R/ids-1.txt
for gpu in 0 1; do
  CUDA_VISIBLE_DEVICES=$gpu benchmarks/experiments/gpu_test_shard.sh $R decode-$gpu 540 -v $(cat $R/ids-$gpu.txt) &
done
wait
for f in $R/tests-*.txt; do echo "$f: $(grep -c PASSED $f) passed, $(grep -c 'FAILED\|ERROR' $f) failed"; tail -n 1 $f; done
grep -h "FAILED\|ERROR" $R/tests-*.txt | head
wc -l < $R/ids.txt
