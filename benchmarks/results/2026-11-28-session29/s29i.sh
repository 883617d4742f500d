#!/usr/bin/env bash
# The eager host cost of a decode call beside FlashInfer's fa3 in the same processes (its host time the yardstick
# for this host's speed, as in 2026-11-26-eager-overhead-final: mla_decode(out=) 0.91x fa3's host time at 128h
# 1 x 1024), main after v90b, 2 rounds. Host: bash ../shared/tools/flashinfer_device.sh prepare .device/flashinfer;
# carry [".device/flashinfer"].
set -uo pipefail
R=$OUT/s29i
mkdir -p $R
eval "$(bash .device/flashinfer/flashinfer_device.sh install .device/flashinfer)"
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
for round in 1 2; do
  echo "== round $round" >> $R/overhead.txt
  PYTHONPATH=src:$PYTHONPATH timeout 200 python -m mlakit.bench overhead --case decode,128,1,1024,1 \
    --case decode,128,64,1024,1 --json $R/overhead-$round.json 2>&1 | grep "^decode" >> $R/overhead.txt
done
cut -c1-150 $R/overhead.txt
