"""Gluon builtins whose names differ between the Triton versions the Hopper kernels compile with: 3.6 (the CUDA
images these kernels were tuned on) and 3.7 (the version torch 2.13 pins)."""
from __future__ import annotations

from triton.experimental.gluon import language as gl

# A barrier over the threads of the CTA, or of the partition inside `gl.warp_specialize` that calls it: named
# `thread_barrier` in Triton 3.6, `barrier` from 3.7 (the same instruction).
thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
