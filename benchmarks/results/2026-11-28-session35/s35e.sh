#!/usr/bin/env bash
# v100's GPU tests, three shards side by side: the decode file's plan / share / waves / merge / ragged tests with the
# share-plan file, the fuzz / fp8-scale / eager tests, and the drop-ins, graphs, forward and warm-up (FlashMLA and
# FlashInfer not installed for this call: their side-by-side tests skip).
set -uo pipefail
R=$OUT/s35e
mkdir -p $R
S=benchmarks/experiments/gpu_test_shard.sh
$S $R plan 330 tests/test_triton_decode_gpu.py tests/test_decode_share_plan.py \
  -k "share or waves or few_long or merge or ragged or kv_range or split" &
$S $R fuzz 330 tests/test_fuzz_attention.py tests/test_fp8_scales.py tests/test_eager_calls.py &
$S $R serving 330 tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py tests/test_graphs.py \
  tests/test_forward.py tests/test_warmup.py &
wait
for f in $R/tests-*.txt; do echo "$f: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' $f | tail -1) $(tail -1 $f)"; done
grep -h "^FAILED\|^ERROR" $R/tests-*.txt | head -20
