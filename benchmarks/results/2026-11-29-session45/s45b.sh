#!/usr/bin/env bash
# Forty-fifth session, call 2, carry ["build/triton37"]: v103 / v104 on a GPU under Triton 3.7.1 (torch 2.13's pin,
# what `make` installs; until now only the image's 3.6 ran them): the whole decode GPU test file in four parallel
# shards (round-robin over its collected ids) and the warm-up no-compile tests, then the demo under 3.7.1.
set -uo pipefail
R=$OUT/s45b
mkdir -p $R /tmp/cache37
t0=$(date +%s)
source benchmarks/experiments/with_packed_triton.sh build/triton37
export TRITON_CACHE_DIR=/tmp/cache37 PYTHONPATH=$PACKED_TRITON:src
python -c "import triton; print('triton', triton.__version__)" | tee $R/versions.txt
python -m pytest -q --collect-only -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py 2>/dev/null \
  | grep "::" > $R/ids.txt
echo "collected $(wc -l < $R/ids.txt)"
for s in 0 1 2 3; do
  awk -v s=$s 'NR % 4 == s' $R/ids.txt > $R/ids-$s.txt
  timeout -s INT -k 20 420 python -m pytest -q -rf -p no:cacheprovider -m gpu $(cat $R/ids-$s.txt) \
    > $R/tests-decode-$s.txt 2>&1 &
done
timeout -s INT -k 20 420 python -m pytest -q -rf -p no:cacheprovider -m gpu tests/test_warmup.py \
  > $R/tests-warmup.txt 2>&1 &
wait
for f in $R/tests-*.txt; do echo "$(basename $f): $(tail -n 1 $f)"; grep "^FAILED\|^E  " $f | head -5; done
echo "tests $(( $(date +%s) - t0 )) s"
timeout $(( 570 - ($(date +%s) - t0) )) python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 3 $R/demo-gpu.txt; echo "total $(( $(date +%s) - t0 )) s"
