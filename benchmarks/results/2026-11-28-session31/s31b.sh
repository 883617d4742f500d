#!/usr/bin/env bash
# v95 (the seesaw's split partials in the output's 16-bit dtype, staged and stored in row pieces; the working tree):
# (1) the GPU tests over the seesaw's splits, merges and share plans; (2) SEESAW_16BIT_PARTIALS off / on in one
# process (setting_ab.py: outputs compared, flushed L2, interleaved): 128h split plans (combine, in-kernel merges,
# shares, ragged, batch 1), plans that split nothing (controls), 16h bf16 and 128h fp8.
set -uo pipefail
R=$OUT/s31b
mkdir -p $R
timeout -s INT -k 20 230 python -m pytest -q -x -rf -p no:cacheprovider -m gpu tests/test_triton_decode_gpu.py \
  -k "persistent or equal_share or several_waves or forced_split or kv_range or hopper_kernel_matches" > $R/tests.txt 2>&1
echo "rc $?" >> $R/tests.txt
tail -n 3 $R/tests.txt
AB="python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.SEESAW_16BIT_PARTIALS f32=False b16=True --"
export PYTHONPATH=src:benchmarks/experiments
timeout 170 $AB 128,24,16384,2 128,16,16384,1 128,40,4096,2 128,40,8192,2 128,64,ragged,1 128,64,ragged,2 \
  128,1,16384,1 128,64,4096,2 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-128h.txt
tail -n 8 $R/ab-128h.txt
timeout 150 $AB 16,64,ragged,1 16,64,ragged,2 16,16,4096,1 16,64,4096,2 128,64,1024,2 \
  128,40,4096,2,fp8_e4m3 128,64,ragged,2,fp8_e4m3 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-16h-fp8.txt
tail -n 7 $R/ab-16h-fp8.txt
