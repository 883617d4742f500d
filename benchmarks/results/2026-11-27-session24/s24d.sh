#!/usr/bin/env bash
# Session 24, call d: v84 (split counts rounded down where a batch that is not ragged would otherwise overflow one wave
# of programs: `decode_split_plan.FIT_SPLITS_TO_ONE_WAVE`) against rounding to the nearest, at 16 and 128 heads, bf16
# and fp8 (default, then e4m3 scores with the hint); then the fuzz tests and the decode GPU tests on splits.
set -uo pipefail
mkdir -p $OUT/s24d
R=$OUT/s24d
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
PLAIN="16,48,4096,2,fp8_e4m3 16,100,4096,1,fp8_e4m3 16,96,1024,1,fp8_e4m3 16,24,4096,1,fp8_e4m3 16,48,1024,2,fp8_e4m3
 16,48,4096,2 16,48,4096,1 16,48,16384,1 128,24,4096,1 128,24,4096,1,fp8_e4m3 16,64,ragged,2,fp8_e4m3 128,64,ragged,2
 16,64,4096,2"
HINTED="16,48,4096,2,fp8_e4m3 16,100,4096,1,fp8_e4m3 16,64,4096,2,fp8_e4m3"
(cd benchmarks/experiments && export PYTHONPATH=../../src:. &&
 timeout 300 python setting_ab.py decode_split_plan.FIT_SPLITS_TO_ONE_WAVE nearest=False fit=True -- $PLAIN \
   > $R/fit-plain.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/fit-plain.txt
 timeout 200 python setting_ab.py decode_split_plan.FIT_SPLITS_TO_ONE_WAVE nearest=False fit=True -- \
   --e4m3-scores --hinted $HINTED > $R/fit-hinted.txt 2>&1; echo "rc $? after ${SECONDS}s" >> $R/fit-hinted.txt)
PYTHONPATH=src timeout $((580 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests/test_fuzz_attention.py \
  "tests/test_triton_decode_gpu.py" -k "fuzz or split or plan or ragged or graph" > $R/tests-v84.txt 2>&1
echo "rc $? after ${SECONDS}s" >> $R/tests-v84.txt
tar -C $OUT -czf $OUT/s24d.tgz s24d && rm -rf $R
