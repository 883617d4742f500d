#!/usr/bin/env bash
# Prepared for the forty-fourth session (no carry, the image's Triton 3.6): first v103's GPU test in the form the review
# asked for (plans for 8 SMs: units of 11-47 tiles; the flag each launch got), then why v103 costs the 1024-token
# batches. (1) In one process (setting_ab.py: CUDA-graph replay, L2 flushed, variants interleaved, outputs compared,
# each variant's kernels profiled): the left half of S ahead from 1 row tile, from 4 (HEAD's setting) and never, on
# short and long 128-head batches at q_len 2 and 1. (2) The seesaw's in-kernel timeline of 64 x 1024 q2 with it on and
# off (seesaw_timeline.py; its stamped copy with the setting edited), per-unit phases for each program's first and later
# units: a per-unit cost shows as a later "S0 done(wg0)" or a longer loop at the same tile count.
set -uo pipefail
R=$OUT/s44a
mkdir -p $R
t0=$(date +%s)
benchmarks/experiments/gpu_test_shard.sh $R ahead 200 tests/test_triton_decode_gpu.py -v -k "left_scores_ahead"
tail -n 2 $R/tests-ahead.txt; grep "FAILED" $R/tests-ahead.txt | head; echo "test $(( $(date +%s) - t0 )) s"
PYTHONPATH=src:benchmarks/experiments:tests timeout 220 python benchmarks/experiments/setting_ab.py \
  hopper_decode.dispatch.LEFT_SCORES_AHEAD_MIN_ROW_TILES from1=1 from4=4 never=1000000 -- \
  128,64,1024,2 128,64,2048,2 128,64,4096,2 128,64,ragged,2 128,64,1024,1 > $R/setting-ab.txt 2>&1
echo "rc $?" >> $R/setting-ab.txt; grep -v "Warn" $R/setting-ab.txt | tail -n 40
echo "setting ab $(( $(date +%s) - t0 )) s"
python benchmarks/experiments/seesaw_timeline.py stamp .device/tl_on > /dev/null
cp -r .device/tl_on .device/tl_off
sed -i 's/^LEFT_SCORES_AHEAD_MIN_ROW_TILES = 4$/LEFT_SCORES_AHEAD_MIN_ROW_TILES = 1000000/' \
  .device/tl_off/src/mlakit/kernels/hopper_decode/dispatch.py
grep -n "^LEFT_SCORES_AHEAD_MIN_ROW_TILES" .device/tl_*/src/mlakit/kernels/hopper_decode/dispatch.py
for v in on off; do
  PYTHONPATH=.device/tl_$v/src:tests:benchmarks/experiments timeout 70 \
    python benchmarks/experiments/seesaw_timeline.py \
    run 128,64,1024,2 128,64,4096,2 > $R/timeline-$v.txt 2>&1; echo "rc $?" >> $R/timeline-$v.txt
  tail -n 30 $R/timeline-$v.txt
done
echo "total $(( $(date +%s) - t0 )) s"
