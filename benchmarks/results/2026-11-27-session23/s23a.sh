#!/usr/bin/env bash
# Session 23, call a: the whole GPU test suite in seven concurrent shards (compiles are CPU-bound), and the demo.
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $OUT/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
shard() {
  local name=$1; shift
  PYTHONPATH=src timeout 540 python -m pytest -q -p no:cacheprovider -m gpu "$@" > $OUT/tests-$name.txt 2>&1
  echo "rc $?" >> $OUT/tests-$name.txt
}
shard prefill-hopper tests/test_prefill_hopper_gpu.py &
shard decode tests/test_triton_decode_gpu.py &
shard compat-flash-mla tests/test_compat_flash_mla_gpu.py &
shard fuzz tests/test_fuzz_attention.py &
shard prefill tests/test_prefill_fp8_gpu.py tests/test_prefill_gpu.py &
shard rest tests/test_compat_flashinfer_gpu.py tests/test_gather_decompress_gpu.py tests/test_graphs.py \
  tests/test_l2_evict_first.py tests/test_demo.py tests/test_gpu.py tests/test_fp8_scales.py tests/test_bench_timing.py \
  tests/test_warmup.py tests/test_distributed_model_gpu.py tests/test_distributed_gpu.py tests/test_bench_graphs_gpu.py \
  tests/test_workspace.py tests/test_prefill_prepared.py tests/test_forward.py tests/test_eager_calls.py &
(PYTHONPATH=src timeout 540 python -m mlakit.cli demo > $OUT/demo.txt 2>&1; echo "rc $?" >> $OUT/demo.txt) &
wait
tail -n 3 $OUT/tests-*.txt $OUT/demo.txt
