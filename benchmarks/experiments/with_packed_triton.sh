# Device helper, sourced: unpacks a Triton packed by pack_triton.sh (its folder or its two folders, carried) into /tmp
# once and exports PACKED_TRITON (the folder to put first on PYTHONPATH), TRITON_BACKENDS_IN_TREE and the ptxas paths:
# the image's Triton's ptxas, and its ptxas-blackwell unless the package brought its own (then the image's nvdisasm
# is linked beside that one, where the SASS scans look for it).
#   source benchmarks/experiments/with_packed_triton.sh build/triton37
#   source benchmarks/experiments/with_packed_triton.sh build/t39a build/t39b
PACKED_TRITON=/tmp/packed-triton
image_bin=$(python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin
parts=()
for d in "$@"; do
  for part in "$d"/libtriton.so.xz "$d"/libtriton.so.xz.part*; do
    [ ! -f "$part" ] || parts+=("$part")
  done
done
if [ ${#parts[@]} -eq 0 ]; then
  echo "with_packed_triton.sh: expected libtriton.so.xz (or its parts) in $*, found none" >&2
  return 1
fi
if [ ! -f $PACKED_TRITON/triton/_C/libtriton.so ]; then
  mkdir -p $PACKED_TRITON
  tar -xJf "$1/package.tar.xz" -C $PACKED_TRITON
  cat "${parts[@]}" | xz -dc > $PACKED_TRITON/libtriton.so.partial || {
    echo "with_packed_triton.sh: libtriton.so did not unpack from ${parts[*]} (a part missing?)" >&2
    rm -f $PACKED_TRITON/libtriton.so.partial
    return 1
  }
  mv $PACKED_TRITON/libtriton.so.partial $PACKED_TRITON/triton/_C/libtriton.so
  for d in "$@"; do
    if [ -f "$d/ptxas-blackwell.xz" ]; then
      xz -dc "$d/ptxas-blackwell.xz" > $PACKED_TRITON/triton/backends/nvidia/bin/ptxas-blackwell
      chmod +x $PACKED_TRITON/triton/backends/nvidia/bin/ptxas-blackwell
      ln -sf "$image_bin/nvdisasm" $PACKED_TRITON/triton/backends/nvidia/bin/nvdisasm
    fi
  done
fi
export PACKED_TRITON TRITON_BACKENDS_IN_TREE=1
export TRITON_PTXAS_PATH=$image_bin/ptxas
if [ -x $PACKED_TRITON/triton/backends/nvidia/bin/ptxas-blackwell ]; then
  export TRITON_PTXAS_BLACKWELL_PATH=$PACKED_TRITON/triton/backends/nvidia/bin/ptxas-blackwell
else
  export TRITON_PTXAS_BLACKWELL_PATH=$image_bin/ptxas-blackwell
fi
