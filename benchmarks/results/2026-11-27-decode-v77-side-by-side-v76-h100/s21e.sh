#!/usr/bin/env bash
# Session 21, call 5: FlashMLA 9241ae3 built; power_probe.py (each call captured 20 times in a graph, replayed back to
# back for 4 s under nvidia-smi sampling) of HEAD's decode and FlashMLA's at 128 heads q2: the 16384-token batches at
# 64 and 128 sequences (same per-tile rate beside FlashMLA at 64, 5-6% slower at 128 in one call of this session,
# level in another), 128 x 4096 and the ragged batch.
# carry: build/dev build/flashmla-src
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
timeout 220 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $OUT/build.txt 2>&1
echo "build $(( $(date +%s)-t0 )) s"; tail -1 $OUT/build.txt
PYTHONPATH=build/flashmla:src:tests:benchmarks/experiments timeout 300 python benchmarks/experiments/power_probe.py \
  --decode 128,64,16384,2 --decode 128,128,16384,2 --decode 128,128,4096,2 --decode 128,64,ragged,2 \
  --decode 128,64,16384,1 --decode 128,128,16384,1 2>&1 | grep -v "Warn\|_sync_debug" | tee $OUT/power-probe.txt
