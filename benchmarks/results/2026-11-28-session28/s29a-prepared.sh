#!/usr/bin/env bash
# Prepared for the next session (not run): the forced-shares probe again, with the split sequences merged by the
# combine kernel instead of in the seesaw. s28g.sh forced equal shares (programs change units at different tiles) and
# lost 10-31%; but at these batches the share plans' split ceiling is 2-3, under MERGE_MAX_SPLITS (4), so every cut
# sequence was merged in the kernel, by the program that wrote its last piece, a chain of L2 round trips on the
# critical path (9-13 us a merge, NOTES.md v74-v80). FlashMLA's schedule (cuts anywhere, a combine kernel) reaches
# 65 us at 128h 64 x 1024 q2 against our 78. Trees (host preparation below): base = HEAD's src; shares = the share
# estimate's gain test removed (shares wherever they fit); shares-combine = that and MERGE_MAX_SPLITS = 1.
# Host:
#   rm -rf build/dev && mkdir -p build/dev/base build/dev/shares build/dev/shares-combine
#   for t in base shares shares-combine; do git archive HEAD src | tar -x -C build/dev/$t; done
#   python3 benchmarks/results/2026-11-28-session28/s29a-trees.py
# carry ["build/dev"].
set -uo pipefail
R=$OUT/s29a
mkdir -p $R
timeout 500 benchmarks/experiments/ab_source_trees.sh 2 build/dev/base/src build/dev/shares/src \
  build/dev/shares-combine/src -- \
  --case 128,64,1024,2,bf16,64 --case 128,128,4096,1,bf16,64 --case 128,64,4096,2,bf16,64 \
  --case 128,64,4096,1,fp8_e4m3,64 --backends triton --no-baseline --clean-l2 > $R/ab-shares-combine.txt 2>&1
echo "ab rc $?" >> $R/ab-shares-combine.txt
grep -v "Warning\|_set_sync" $R/ab-shares-combine.txt | cut -c1-120
