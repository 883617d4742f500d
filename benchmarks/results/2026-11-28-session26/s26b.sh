#!/usr/bin/env bash
# v79's equal-share probe where the unit rounding is large, not 3%: odd
# 128-head batches (24, 40, 48 sequences: after v87 still 1.09-1.40x FlashMLA, s25d/v87.txt) and uneven ones (lengths
# within 20% of N, not ragged: one wave whose makespan is the longest sequence's; modelled at 1.2x the even share).
# The share plan (host-built, lockstep) against the default plan (v87's) in one process, clean L2, three rounds;
# NOTES.md "v79" for the probe, "Next (issue 23)" for why again. The patch applies to 4cea22a and its seesaw
# compiles for sm_90a (CPU, triton 3.6: no spills at bf16, fp8 as in v79).
# Before the call, on the CPU (from a81443a or later: the ~N cases need `DecodeCase.uneven`, and the tree's own
# mlakit comes first on the path): rm -rf build/dev/shares && mkdir -p build/dev/shares &&
#   git archive HEAD src | tar -x -C build/dev/shares &&
#   git apply --directory=build/dev/shares --include='build/dev/shares/src/*'
#   benchmarks/experiments/patches/v79-seesaw-share-plan-ranges.diff; carry build/dev.
set -uo pipefail
R=$OUT/s26b
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $R/device.txt
PYTHONPATH=build/dev/shares/src:benchmarks/experiments timeout 560 python benchmarks/experiments/share_plan_probe.py \
  128,40,8192,2 128,24,16384,2 128,24,16384,1 128,24,4096,2 128,48,4096,1 128,32,~16384,2 128,64,~4096,2 \
  > $R/shares-odd-uneven.txt 2>&1
echo "rc $? after ${SECONDS}s" >> $R/shares-odd-uneven.txt
tail -n 20 $R/shares-odd-uneven.txt
