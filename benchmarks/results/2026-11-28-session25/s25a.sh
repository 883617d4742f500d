#!/usr/bin/env bash
# Run in the twenty-fifth session: v86 (the 32-row e4m3 tile also where a batch's 16-row tiles alone overflow
# one wave, hint or not; patches/v86-wide-tile-where-16-row-tiles-overflow-one-wave.diff) against HEAD, each tree in
# its own `e4m3_scores_ab.py` process (its unhinted e4m3 rows show the batch rule alone, the hinted ones both rules),
# both trees compiled first in concurrent processes, then two passes in alternating order, as s24a.sh.
# Before the call, on the CPU: mkdir -p build/dev/v86 build/dev/base && git archive HEAD src | tar -x -C build/dev/v86
#   && git archive HEAD src | tar -x -C build/dev/base && git apply --directory=build/dev/v86 --include='build/dev/v86/src/*'
#   benchmarks/experiments/patches/v86-wide-tile-where-16-row-tiles-overflow-one-wave.diff; carry build/dev.
#   (The patch was removed from benchmarks/experiments/patches/ once it landed: `git show 8a20003 -- src` is it.)
set -uo pipefail
mkdir -p $OUT/s25a
R=$OUT/s25a
CASES="16,256,256,2 16,200,512,2 16,160,1024,2 16,512,128,2 16,140,4096,2 16,132,1024,2 16,128,512,2 32,256,256,1"
ab() {
  local name=$1 pass=$2 limit=$3
  PYTHONPATH=build/dev/$name/src:benchmarks/experiments timeout $limit python benchmarks/experiments/e4m3_scores_ab.py \
    --json $R/ab-$name-$pass.json $CASES > $R/ab-$name-$pass.txt 2>&1
  echo "rc $? after ${SECONDS}s" >> $R/ab-$name-$pass.txt
}
ab base 0 230 &
ab v86 0 230 &
wait
for run in base,1 v86,1 v86,2 base,2; do
  left=$((575 - SECONDS)); [ $left -lt 60 ] && break
  ab ${run%,*} ${run#*,} $left
done
tar -C $OUT -czf $OUT/s25a.tgz s25a && rm -rf $R
