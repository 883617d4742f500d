#!/usr/bin/env bash
# The eager host cost of a decode call, today's main (src) against cbdc074 (build/dev/old: the commit of
# 2026-11-26-eager-overhead-final, where mla_decode(out=) took 18-27 us), alternating processes, 2 rounds: s29g
# measured 41.8 / 33.1 us with no peer in the run to tell the host's speed from a regression.
# Host: mkdir -p build/dev/old && git archive cbdc074 src | tar -x -C build/dev/old; carry ["build/dev"].
set -uo pipefail
R=$OUT/s29h
mkdir -p $R
for round in 1 2; do
  for tree in build/dev/old/src src; do
    echo "== $tree round $round" >> $R/overhead.txt
    PYTHONPATH=$tree timeout 100 python -m mlakit.bench overhead --case decode,128,1,1024,1 --case decode,128,64,1024,1 \
      --json /tmp/o.json 2>&1 | grep "mla_decode" >> $R/overhead.txt
  done
done
cat $R/overhead.txt | cut -c1-100
