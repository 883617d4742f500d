#!/usr/bin/env bash
# Device experiment: the same `mlakit bench decode` cases under two source trees, in alternating processes
# over several rounds (kernel versions that cannot share a process, compared across the machine's drift).
# Prepare the old tree on the host first, e.g. `git archive HEAD src | tar -x -C ab_old` (the device gets
# the working tree, not the repository), then on the device:
#   benchmarks/experiments/ab_source_trees.sh ab_old/src src 2 --case 16,16,1024,1,bf16,64 --no-baseline
# Prints our kernel's rows, each labelled with its tree and round.
set -euo pipefail
old=$1 new=$2 rounds=$3
shift 3
for round in $(seq "$rounds"); do
  for tree in "$old" "$new"; do
    PYTHONPATH=$tree python -m mlakit.bench decode "$@" --json /tmp/ab_source_trees.json --plot /tmp/ab_source_trees.png \
      | grep " triton " | sed "s|^|$tree round $round: |"
  done
done
