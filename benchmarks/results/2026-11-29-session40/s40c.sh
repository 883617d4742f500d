#!/usr/bin/env bash
# The GPU demo on e82339d (v102 landed, off), then v102's lead swept (setting_ab.py, graph replay, clean L2, variants
# interleaved; the image's Triton 3.6). s40b measured v102 a wash (ragged -0.5 to -1.7% against the model's -8 to -10%;
# other batches -5% to +12%). Under SHARES_BY_COST the piece cost is both the leads' length and the share gate's price
# of a piece; ragged batches take shares without the gate, so there it moves the layout alone. Is 7 tile-times the
# lead that pays? Then s40b's off / on A/B again over the same cases (its noise).
set -uo pipefail
R=$OUT/s40c
mkdir -p $R
PYTHONPATH=src timeout 170 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 4 $R/demo-gpu.txt
cases="128,64,ragged,2 128,64,ragged,1 128,64,ragged,2,fp8_e4m3 64,64,ragged,2 128,40,1024,2 128,24,4096,1 \
128,40,8192,2 128,48,8192,2"
PYTHONPATH=src:benchmarks/experiments timeout 240 python benchmarks/experiments/setting_ab.py \
  decode_split_plan.HOPPER_SHARE_PIECE_COST_TILES p7=7 p3=3 p5=5 p10=10 p14=14 +decode_split_plan.SHARES_BY_COST=True \
  -- $cases 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-lead.txt
tail -n 8 $R/ab-lead.txt
PYTHONPATH=src:benchmarks/experiments timeout 120 python benchmarks/experiments/setting_ab.py \
  decode_split_plan.SHARES_BY_COST tiles=False cost=True -- $cases 2>&1 | grep -v "Warn\|_sync_debug" > $R/ab-v102-again.txt
tail -n 8 $R/ab-v102-again.txt
