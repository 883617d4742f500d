#!/usr/bin/env bash
# Main with v95: the GPU demo, and the decode GPU tests over head counts, draft lengths, page sizes, kv formats,
# ragged extends, padded rows and subnormal values (the seesaw's 16-bit partials at odd head counts and fp16).
set -uo pipefail
R=$OUT/s31d
mkdir -p $R
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 5 $R/demo-gpu.txt
timeout -s INT -k 20 360 python -m pytest -q -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "heads_and_draft or page_sizes_and_kv or extend_with_ragged or padded_past or subnormal or any_magnitude" \
  > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 3 $R/tests.txt
