#!/usr/bin/env bash
# Session 25, call c: the tree with v86 on the GPU: the decode GPU tests on the narrow kernel, e4m3 scores and fp8
# (with v86's new unhinted 150-sequence case), the plan / split / hint / ragged / graph tests, and the demo, in
# concurrent shards.
set -uo pipefail
mkdir -p $OUT/s25c
R=$OUT/s25c
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
LEFT=540
shard() {
  local name=$1; shift
  PYTHONPATH=src timeout $LEFT python -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/tests-$name.txt 2>&1
  echo "rc $? after ${SECONDS}s" >> $R/tests-$name.txt
}
shard decode-narrow tests/test_triton_decode_gpu.py -k "narrow or e4m3 or fp8" &
shard decode-plans tests/test_triton_decode_gpu.py -k "not (narrow or e4m3 or fp8) and (split or plan or hint or ragged or graph or wide)" &
(PYTHONPATH=src timeout $LEFT python -m mlakit.cli demo > $R/demo.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/demo.txt) &
wait
tar -C $OUT -czf $OUT/s25c.tgz s25c
tail -n 2 $R/tests-*.txt $R/demo.txt
