#!/usr/bin/env bash
# Host helper: a Triton release packed to fit the device call's carry (64 MiB with the repository), for running the
# kernels under a Triton the device image lacks (NOTES.md "The Gluon kernels under Triton 3.7"). Downloads the wheel
# for the device's Python (3.12), drops what a decode / prefill run does not load (the AMD backend is kept, as the
# backends are found in-tree, but for 3.9's codegen library, loaded only to compile for AMD), strips libtriton.so and
# xz-compresses it apart from the rest. The device uses its own Triton's ptxas, but from 3.9 on Triton compiles sm_90
# with its `ptxas-blackwell` (CUDA 13.4 in 3.9.0, the image's is 12.9), so that one is packed too where the wheel's
# compiler picks it below sm_100.
#   benchmarks/experiments/pack_triton.sh 3.7.1 build/triton37     # then carry ["build/triton37"]
# With a second folder, the package is split between the two (3.9.0 is 50 MiB, over the carry beside the tree): carry
# the first in one call and the second in the next call on the same warm machine, which keeps the first.
#   benchmarks/experiments/pack_triton.sh 3.9.0 build/t39a build/t39b
# On the device: source benchmarks/experiments/with_packed_triton.sh build/triton37 (or build/t39a build/t39b), then
# PYTHONPATH=$PACKED_TRITON:src.
set -euo pipefail
version=$1 out=$2 second=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip download "triton==$version" --python-version 3.12 --only-binary=:all: --no-deps \
  --platform manylinux_2_28_x86_64 -d "$work/wheel" -q
(cd "$work" && unzip -q wheel/*.whl 'triton/*')
t=$work/triton
bin=$t/backends/nvidia/bin
if grep -q "if arch < 90:" "$t"/backends/nvidia/compiler.py; then  # 3.9's get_ptxas: ptxas below sm_90 only
  xz -T0 -9e -c "$bin/ptxas-blackwell" > "$work/ptxas-blackwell.xz"
fi
rm -rf "$bin"/{ptxas,ptxas-blackwell,cuobjdump,nvdisasm} "$t"/backends/nvidia/lib/cupti* \
  "$t"/backends/amd/lib/libtriton_amd_codegen.so "$t"/plugins "$t"/instrumentation "$t"/FileCheck "$t"/_C/libproton.so
mv "$t"/_C/libtriton.so "$work/libtriton.so"
strip --strip-all "$work/libtriton.so"
rm -rf "$out" ${second:+"$second"}
mkdir -p "$out"
tar -C "$work" -cf - triton | xz -T0 -9 > "$out/package.tar.xz"
xz -T0 -9e -c "$work/libtriton.so" > "$work/libtriton.so.xz"
if [ -n "$second" ]; then
  mkdir -p "$second"
  split -n 2 -d "$work/libtriton.so.xz" "$work/libtriton.so.xz.part"
  mv "$work/libtriton.so.xz.part00" "$out/"
  mv "$work/libtriton.so.xz.part01" "$second/"
  [ ! -f "$work/ptxas-blackwell.xz" ] || mv "$work/ptxas-blackwell.xz" "$second/"
else
  mv "$work/libtriton.so.xz" "$out/"
  [ ! -f "$work/ptxas-blackwell.xz" ] || mv "$work/ptxas-blackwell.xz" "$out/"
fi
du -sh "$out"/* ${second:+"$second"/*}
