#!/usr/bin/env bash
# Forty-second session, call 1, carry ["build/t39a"] (the first half of Triton 3.9.0's packed libtriton.so.xz and its
# package; s42b.sh, the next call on the same warm machine, carries the second half): the GPU demo on HEAD, image's
# Triton 3.6 (not rerun since the forty-first session's last commits).
set -uo pipefail
R=$OUT/s42a
mkdir -p $R
t0=$(date +%s)
ls -la build/t39a
PYTHONPATH=src timeout 300 python -m mlakit.cli demo > $R/demo-gpu.txt 2>&1; echo "rc $?" >> $R/demo-gpu.txt
tail -n 3 $R/demo-gpu.txt; echo "demo $(( $(date +%s) - t0 )) s"
