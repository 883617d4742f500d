#!/usr/bin/env bash
# Our decode under the image's Triton 3.6 and under 3.7.1 (carried as in s37a.sh) in alternating processes (order
# 3.6, 3.7, 3.7, 3.6): `mlakit bench decode`, graph replay, clean L2; then the decode GPU tests s37a's limit cut off,
# under 3.7.1. Carry ["build/triton37"].
set -uo pipefail
R=$OUT/s37b
mkdir -p $R /tmp/t37
[ -f /tmp/t37/triton/_C/libtriton.so ] || { tar -xJf build/triton37/package.tar.xz -C /tmp/t37 &&
  xz -dc build/triton37/libtriton.so.xz > /tmp/t37/triton/_C/libtriton.so && chmod +x /tmp/t37/triton/_C/libtriton.so; }
export TRITON_BACKENDS_IN_TREE=1
export TRITON_PTXAS_PATH=$(python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin/ptxas
CASES="--case 128,64,4096,1 --case 128,64,4096,2 --case 128,64,16384,2 --case 128,64,ragged,2 --case 16,64,4096,2
  --case 16,64,ragged,1 --case 128,64,4096,1,fp8_e4m3 --case 16,64,4096,2,fp8_e4m3"
i=0
for tree in 36 37 37 36; do
  i=$((i + 1))
  if [ $tree = 37 ]; then path=/tmp/t37:src; else path=src; fi
  PYTHONPATH=$path timeout 150 python -m mlakit.bench decode $CASES --no-baseline --clean-l2 --json $R/bench-$i-$tree.json \
    --plot /tmp/s37b.png > $R/bench-$i-$tree.txt 2>&1
  grep " us " $R/bench-$i-$tree.txt | cut -c1-75 | sed "s|^|triton $tree run $i: |"
done
PYTHONPATH=/tmp/t37:src timeout -s INT -k 15 200 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "several_waves or equal_share or kv_range or prefetch or snake or other_lengths or ragged_batches or share_plans_merge" \
  > $R/tests-decode-rest.txt 2>&1
echo "rc $?" >> $R/tests-decode-rest.txt
grep -E "passed|failed|^rc |^(FAILED|ERROR)" $R/tests-decode-rest.txt | tail -6
