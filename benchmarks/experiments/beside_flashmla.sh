#!/usr/bin/env bash
# Device experiment: our decode beside FlashMLA in one process (`mlakit bench decode --backends triton,flashmla
# --no-baseline --clean-l2`), FlashMLA built first (unless build/flashmla already imports) from a source tree carried
# to the device (scripts/build_flashmla.py; FlashMLA 9241ae3 with cutlass 147f5673's include/ and tools/util/include/
# under csrc/cutlass, ~30 MB), each group of cases run while the budget leaves time for it. On the device, from the
# repository root:
#   benchmarks/experiments/beside_flashmla.sh OUTDIR SOURCES BUDGET_S "NAME=CASE CASE ..." ...
#   benchmarks/experiments/beside_flashmla.sh $OUT build/flashmla-src 560 "h16=16,64,ragged,1 16,64,ragged,2"
# (one quoted argument a group: its name, "=", its cases separated by spaces, each
# heads,batch,seqlen|~seqlen|ragged,q_len[,kv_dtype[,page_size]]).
# Writes OUTDIR/NAME.json and OUTDIR/NAME.txt per group, and a build's log to OUTDIR/build.txt; stops if FlashMLA
# does not import after the build (its rows would be missing from every table). MLAKIT_SRC names another tree of our
# package to time (default src; e.g. build/dev/v89/src, a kernel version not yet landed).
set -uo pipefail
set -f
out=$1 sources=$2 budget=$3
shift 3
mkdir -p "$out"
t0=$(date +%s)
deadline=$(( t0 + budget ))
if ! PYTHONPATH=build/flashmla python -c "import flash_mla" 2>/dev/null; then
  timeout "$budget" python scripts/build_flashmla.py "$sources" build/flashmla --jobs 16 --no-fp16 > "$out/build.txt" 2>&1
  echo "build $(( $(date +%s) - t0 )) s: $(tail -1 "$out/build.txt")"
  PYTHONPATH=build/flashmla python -c "import flash_mla" || { echo "FlashMLA does not import: see build.txt"; exit 1; }
fi
for group in "$@"; do
  case $group in *=*) ;; *) echo "group $group: expected NAME=CASES"; exit 2 ;; esac
  name=${group%%=*}
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "$name skipped (deadline)"; continue; fi
  cases=()
  for c in ${group#*=}; do cases+=(--case "$c"); done
  PYTHONPATH=build/flashmla:${MLAKIT_SRC:-src} timeout "$left" python -m mlakit.bench decode --backends triton,flashmla --no-baseline \
    --clean-l2 "${cases[@]}" --json "$out/$name.json" --plot "/tmp/$name.png" 2>&1 \
    | grep -v "Warn\|_sync_debug" > "$out/$name.txt"
  echo "$name t=$(( $(date +%s) - t0 )) s rows=$(grep -c ' us ' "$out/$name.txt")"
done
