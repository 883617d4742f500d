# Device helper, sourced: unpacks a Triton packed by pack_triton.sh (its folder, carried) into /tmp once and exports
# PACKED_TRITON (the folder to put first on PYTHONPATH), TRITON_BACKENDS_IN_TREE and TRITON_PTXAS_PATH (the image's
# Triton's ptxas).
#   source benchmarks/experiments/with_packed_triton.sh build/triton37
PACKED_TRITON=/tmp/packed-triton
if [ ! -f $PACKED_TRITON/triton/_C/libtriton.so ]; then
  mkdir -p $PACKED_TRITON
  tar -xJf "$1/package.tar.xz" -C $PACKED_TRITON
  xz -dc "$1/libtriton.so.xz" > $PACKED_TRITON/triton/_C/libtriton.so
fi
export PACKED_TRITON TRITON_BACKENDS_IN_TREE=1
TRITON_PTXAS_PATH=$(python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin/ptxas
export TRITON_PTXAS_PATH
