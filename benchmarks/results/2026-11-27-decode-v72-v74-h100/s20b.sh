#!/usr/bin/env bash
# Session 20, call 2 (prepared in session 19): FlashMLA built; ncu of our decode (v71 or v72, whichever src holds) and FlashMLA's on the same inputs
# at 128h 64x16384 q2 (per-tile gap 2.5%) and 64x4096 q2 (per-tile level, gap = unit rounding); then compare.
# carry: build/dev/s20b.sh build/flashmla-src
cd "$(dirname "$0")/../.."
root=$PWD
o=/tmp/o; mkdir -p $o
pack() { tar czf $OUT/s20b.tgz -C /tmp o; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $o/gpu.txt
t0=$(date +%s)
timeout 220 python scripts/build_flashmla.py build/flashmla-src build/flashmla --jobs 16 --no-fp16 > $o/build.txt 2>&1
echo "build $(( $(date +%s)-t0 )) s" | tee -a $o/build.txt; tail -1 $o/build.txt
pack
cd benchmarks/experiments
for c in 128,64,16384,2 128,64,4096,2; do
  n=$(echo $c | tr , _); t1=$(date +%s)
  PYTHONPATH=$root/build/flashmla:$root/src timeout 170 ncu --profile-from-start off --clock-control none --set full \
    --import-source no -o /tmp/$n python peer_profile_case.py $c > $o/ncu-$n.log 2>&1
  ncu --import /tmp/$n.ncu-rep --page details --csv > $o/details-$n.csv 2>&1
  ncu --import /tmp/$n.ncu-rep --page source --csv --print-source sass > /tmp/sass-$n.csv 2>&1
  for k in seesaw flash_fwd_splitkv_mla; do
    python ncu_sass_stalls.py /tmp/sass-$n.csv --kernel $k --top 40 > $o/stalls-$n-$k.txt 2>&1
  done
  python ncu_sass_compare.py /tmp/sass-$n.csv seesaw flash_fwd_splitkv_mla > $o/compare-$n.txt 2>&1
  gzip -c /tmp/sass-$n.csv > $o/sass-$n.csv.gz
  echo "$c ncu $(( $(date +%s)-t1 )) s" | tee -a $o/times.txt
  pack
done
