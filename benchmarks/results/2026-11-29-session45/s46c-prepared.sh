#!/usr/bin/env bash
# Prepared in the forty-fifth session (not run: its device time was spent; after s46a): why v103 costs a short unit
# ~1.5 us even where its ahead path is not taken (v103b / v103c lost 5% at 64 x 1024 q2 with the code present, NOTES
# "v103"; v105 did not move it, "v105"). Hypothesis: instruction fetch. Both warpgroups' pair loops are ~1,500-1,600
# SASS instructions (~50 KB together, every SM sub-partition runs a warp of each), and v103 adds ~70 to warpgroup 0's
# loop and 320 to the kernel. Test: ncu --set full of one 128h 64 x 1024 q2 call with v103 on (unhinted plan) and off
# (hinted: v104 turns it off for 16-tile units), and 64 x 4096 q2 on, their warp-state stall shares (no instruction,
# wait, long scoreboard, barrier) and the SASS source page (ncu_sass_stalls.py on the host). Prediction if it holds:
# "stall no instruction" a larger share with v103 on at 64 x 1024 q2 (by >= 2 points) and concentrated at the unit
# change and the loop's head; if the shares match, the cost is elsewhere (the per-unit spills' local loads,
# seesaw_kernel.py:153/205) and the next probe is the seesaw timeline with the spills taken out.
set -uo pipefail
R=$OUT/s46c
mkdir -p $R
t0=$(date +%s)
profile() {  # NAME FLAGS CASE
  PYTHONPATH=src:benchmarks/experiments timeout 150 ncu --kernel-name regex:seesaw --launch-skip 1 --launch-count 1 \
    --set full --clock-control none --import-source no -o /tmp/$1 python benchmarks/experiments/hopper_profile_case.py \
    $2 $3 > $R/ncu-run-$1.txt 2>&1
  ncu --import /tmp/$1.ncu-rep --page details > $R/details-$1.txt 2>&1
  ncu --import /tmp/$1.ncu-rep --page raw --csv 2>/dev/null | gzip > $R/raw-$1.csv.gz
  ncu --import /tmp/$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $R/sass-$1.csv.gz
  echo "$1: $(grep -E "^ *Duration" $R/details-$1.txt | head -1)"
}
profile short-on "" 128,64,1024,2
profile short-off --hinted 128,64,1024,2
profile long-on --hinted 128,64,4096,2
for n in short-on short-off long-on; do
  zcat $R/raw-$n.csv.gz | python -c "
import csv, sys
rows = list(csv.reader(sys.stdin)); head, values = rows[0], rows[-1]
for name, value in zip(head, values):
    if name.startswith('smsp__average_warp') and 'issue_stalled' in name and name.endswith('_per_issue_active.ratio'):
        print('$n', name.split('issue_stalled_')[1].split('_per')[0], value)
" | sort -k3 -g -r | head -8
done
tar -czf $OUT/s46c.tgz -C $OUT s46c && rm -rf $R  # one file back (a call returns a few files only)
echo "total $(( $(date +%s) - t0 )) s"
