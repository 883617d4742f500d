#!/usr/bin/env bash
# Main with v98 (verified by s34a): the GPU demo, and the GPU tests s34a did not run, in three shards side by side:
# the decode file's other tests, the fuzz / fp8-scale / eager tests, and the drop-ins, graphs, forward and warm-up.
set -uo pipefail
R=$OUT/s34b
mkdir -p $R
S=benchmarks/experiments/gpu_test_shard.sh
$S $R decode 470 tests/test_triton_decode_gpu.py -k "not (share or ragged or merge)" &
$S $R fuzz 470 tests/test_fuzz_attention.py tests/test_fp8_scales.py tests/test_eager_calls.py tests/test_gpu.py &
$S $R serving 470 tests/test_compat_flash_mla_gpu.py tests/test_compat_flashinfer_gpu.py tests/test_graphs.py \
  tests/test_forward.py tests/test_warmup.py tests/test_bench_graphs_gpu.py tests/test_workspace.py &
PYTHONPATH=src timeout 200 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 4 $R/demo-gpu.txt
wait
for f in $R/tests-*.txt; do echo "$f: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' $f | tail -1) $(tail -1 $f)"; done
