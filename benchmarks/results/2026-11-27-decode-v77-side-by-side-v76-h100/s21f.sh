#!/usr/bin/env bash
# Session 21, call 6: the GPU-marked tests on HEAD, the demo on the GPU, and benchmarks/experiments/beside_flashmla.sh
# (new) on two 16-head cases.
# carry: build/dev build/flashmla-src
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
PYTHONPATH=src timeout 300 python -m pytest -q -n 8 -m gpu tests > $OUT/tests-gpu.txt 2>&1
echo "tests t=$(( $(date +%s)-t0 )) s"; tail -4 $OUT/tests-gpu.txt
PYTHONPATH=src timeout 120 python -m mlakit.cli demo > $OUT/demo-gpu.txt 2>&1
echo "demo rc=$? t=$(( $(date +%s)-t0 )) s"; tail -4 $OUT/demo-gpu.txt
bash benchmarks/experiments/beside_flashmla.sh $OUT build/flashmla-src $(( 580 - ($(date +%s)-t0) )) \
  "check-beside=16,64,ragged,2 16,16,1024,1"
