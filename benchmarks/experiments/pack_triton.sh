#!/usr/bin/env bash
# Host helper: a Triton release packed to fit the device call's carry (64 MiB with the repository), for running the
# kernels under a Triton the device image lacks (NOTES.md "The Gluon kernels under Triton 3.7"). Downloads the wheel
# for the device's Python (3.12), drops what a decode / prefill run does not load (the AMD backend is kept, as the
# backends are found in-tree, but for 3.9's codegen library, loaded only to compile for AMD), strips libtriton.so and
# xz-compresses it apart from the rest; the device uses its own Triton's ptxas.
#   benchmarks/experiments/pack_triton.sh 3.7.1 build/triton37     # then carry ["build/triton37"]
# On the device: source benchmarks/experiments/with_packed_triton.sh build/triton37, then PYTHONPATH=$PACKED_TRITON:src.
set -euo pipefail
version=$1 out=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip download "triton==$version" --python-version 3.12 --only-binary=:all: --no-deps \
  --platform manylinux_2_28_x86_64 -d "$work/wheel" -q
(cd "$work" && unzip -q wheel/*.whl 'triton/*')
t=$work/triton
rm -rf "$t"/backends/nvidia/bin/{ptxas,ptxas-blackwell,cuobjdump,nvdisasm} "$t"/backends/nvidia/lib/cupti* \
  "$t"/backends/amd/lib/libtriton_amd_codegen.so "$t"/plugins "$t"/instrumentation "$t"/FileCheck "$t"/_C/libproton.so
mv "$t"/_C/libtriton.so "$work/libtriton.so"
strip --strip-all "$work/libtriton.so"
mkdir -p "$out"
tar -C "$work" -cf - triton | xz -T0 -9 > "$out/package.tar.xz"
xz -T0 -9e -c "$work/libtriton.so" > "$out/libtriton.so.xz"
du -sh "$out"/*
