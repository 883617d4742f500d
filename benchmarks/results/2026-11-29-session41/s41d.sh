#!/usr/bin/env bash
# FlashMLA 9241ae3 built for s41e (carry ["build/flashmla-src"]; the machine kept warm between the two calls), and
# tests/test_bench_graphs_gpu.py under the image's Triton 3.6 (bench/graphs.py passes DecodeGraphs its cache's pages
# now, and times replays unchecked).
set -uo pipefail
R=$OUT/s41d
mkdir -p $R
t0=$(date +%s)
timeout 250 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $R/build.txt 2>&1
echo "build $(( $(date +%s) - t0 )) s: $(tail -1 $R/build.txt)"
PYTHONPATH=build/flashmla python -c "import flash_mla; print('flash_mla imports')"
PYTHONPATH=src timeout -s INT -k 10 200 python -m pytest -q -rfEs --tb=short -p no:cacheprovider \
  tests/test_bench_graphs_gpu.py > $R/bench-graphs-t36.txt 2>&1; echo "rc $?" >> $R/bench-graphs-t36.txt
echo "all $(( $(date +%s) - t0 )) s"; tail -n 3 $R/bench-graphs-t36.txt
