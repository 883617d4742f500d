#!/usr/bin/env bash
# Session 24, call f: v84b (splits that grow by sixteenths until a batch that is not ragged fits one wave, instead of
# v84's counts rounded down) against the nearest counts, on uneven batches (lengths within 20% of a length) and two
# uniform ones; then the tree (v83 + v84b + v85) on the GPU: the decode GPU tests on the narrow kernel, fp8, plans,
# splits and hints; the fuzz, graph, compat, api and warm-up tests; and the demo, in concurrent shards.
set -uo pipefail
mkdir -p $OUT/s24f
R=$OUT/s24f
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
CASES="16,40,~8192,2,fp8_e4m3 16,80,~4096,1,fp8_e4m3 16,48,~2048,1,fp8_e4m3 16,72,~16384,2,fp8_e4m3
 16,160,~16384,1,fp8_e4m3 16,80,~16384,2 16,40,~2048,1 16,48,4096,2 128,24,4096,1 16,100,4096,1,fp8_e4m3"
(cd benchmarks/experiments && PYTHONPATH=../../src:. timeout 200 python setting_ab.py \
  decode_split_plan.FIT_SPLITS_TO_ONE_WAVE nearest=False fit=True -- $CASES > $R/fit-uneven.txt 2>&1
 echo "rc $? after ${SECONDS}s" >> $R/fit-uneven.txt)
LEFT=$((570 - SECONDS))
shard() {
  local name=$1; shift
  PYTHONPATH=src timeout $LEFT python -m pytest -q -p no:cacheprovider -m gpu "$@" > $R/tests-$name.txt 2>&1
  echo "rc $? after ${SECONDS}s" >> $R/tests-$name.txt
}
shard decode-narrow tests/test_triton_decode_gpu.py -k "narrow or e4m3 or fp8" &
shard decode-plans tests/test_triton_decode_gpu.py -k "not (narrow or e4m3 or fp8) and (split or plan or hint or ragged or graph or wide)" &
shard fuzz tests/test_fuzz_attention.py &
shard rest tests/test_graphs.py tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py tests/test_api.py \
  tests/test_gpu.py tests/test_warmup.py tests/test_fp8_scales.py tests/test_eager_calls.py &
(PYTHONPATH=src timeout $LEFT python -m mlakit.cli demo > $R/demo.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/demo.txt) &
wait
tar -C $OUT -czf $OUT/s24f.tgz s24f
grep -a " us (" $R/fit-uneven.txt; tail -n 2 $R/fit-uneven.txt $R/tests-*.txt $R/demo.txt
