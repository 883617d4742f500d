#!/usr/bin/env bash
# Main with v96: the GPU demo, and the decode GPU tests over the 128-head batches, head counts and draft lengths, kv
# formats and the graph replay of a plan (where a combine now runs behind the seesaw's in-kernel merges).
set -uo pipefail
R=$OUT/s32h
mkdir -p $R
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 5 $R/demo-gpu.txt
timeout -s INT -k 20 200 python -m pytest -q -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "128_heads or heads_and_draft or cuda_graph or few_long or other_lengths or kv_range" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 3 $R/tests.txt
