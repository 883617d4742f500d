#!/usr/bin/env bash
# Main after v90b (f27504f + v92 dropped): the GPU demo; the eager host cost of a decode call (the seesaw launch took
# two more arguments in v90, `mlakit bench overhead`, with the ceilings); the fp8 prefetch one or two tile pairs ahead
# again now that v90b no longer stalls each unit's loads (v90's 2 pairs were measured with the stall), default and
# e4m3-score paths, one process, clean L2.
set -uo pipefail
R=$OUT/s29g
mkdir -p $R
PYTHONPATH=src timeout 150 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 5 $R/demo-gpu.txt
PYTHONPATH=src timeout 150 python -m mlakit.bench overhead --case decode,128,1,1024,1 --case decode,128,64,1024,1 \
  --json $R/overhead.json > $R/overhead.txt 2>&1; echo "rc $?" >> $R/overhead.txt
grep -v Warn $R/overhead.txt | tail -n 12
export PYTHONPATH=src
timeout 120 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH_PAIRS_FP8 p1=1 p2=2 -- \
  128,64,4096,1,fp8_e4m3 128,128,4096,1,fp8_e4m3 128,64,4096,2,fp8_e4m3 128,64,1024,2,fp8_e4m3 > $R/ab-pairs.txt 2>&1
echo "ab rc $?" >> $R/ab-pairs.txt
timeout 120 python benchmarks/experiments/setting_ab.py hopper_decode.dispatch.L2_PREFETCH_PAIRS_FP8 p1=1 p2=2 -- \
  --e4m3-scores 128,64,4096,1,fp8_e4m3 128,128,4096,1,fp8_e4m3 128,64,4096,2,fp8_e4m3 > $R/ab-pairs-e4m3.txt 2>&1
echo "ab rc $?" >> $R/ab-pairs-e4m3.txt
grep -h " us (\|rc" $R/ab-pairs.txt $R/ab-pairs-e4m3.txt
