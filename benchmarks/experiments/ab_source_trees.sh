#!/usr/bin/env bash
# Device experiment: the same `mlakit bench decode` cases under several source trees, in alternating processes
# over several rounds (kernel versions that cannot share a process, compared across the machine's drift).
# Prepare the other trees on the host first, e.g. `mkdir -p build/dev/base && git archive HEAD src | tar -x -C
# build/dev/base` (build/ is ignored: name build/dev in the device call's carry), then on the device:
#   benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src src -- --case 16,16,1024,1,bf16,64 --no-baseline
# Prints our kernel's rows, each labelled with its tree and round (`ab_table_json.py` reads them).
set -euo pipefail
usage="usage: ab_source_trees.sh ROUNDS TREE [TREE ...] -- BENCH_DECODE_ARGS"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
rounds=$1
shift
trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do trees+=("$1"); shift; done
[ $# -gt 0 ] && [ ${#trees[@]} -gt 0 ] || { echo "$usage" >&2; exit 2; }
shift
for round in $(seq "$rounds"); do
  for tree in "${trees[@]}"; do
    PYTHONPATH=$tree python -m mlakit.bench decode "$@" --json /tmp/ab_source_trees.json --plot /tmp/ab_source_trees.png \
      | grep " triton " | sed "s|^|$tree round $round: |"
  done
done
