"""Gluon builtins whose names differ between the Triton versions the Hopper kernels compile with: 3.6 (the CUDA
images these kernels were tuned on), 3.7 (the version torch 2.13 pins), 3.8 and 3.9.

The kernels call these names, never the versioned ones:

    thread_barrier()                                   # gl.thread_barrier (3.6) / gl.barrier (3.7 on)
    tma_load(desc, [row, col], bar, smem, pred=pred)   # tma.async_copy_global_to_shared / tma.async_load (3.8 on)
    cp_async_load(smem, pointers, mask=mask)           # async_copy.async_copy_global_to_shared / .async_load (3.8 on)
    reinterpret(smem, gl.int32, [rows, cols], layout)  # smem._reinterpret / smem.reinterpret (3.9 on)
"""
from __future__ import annotations

from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import tma

# A barrier over the threads of the CTA, or of the partition inside `gl.warp_specialize` that calls it: named
# `thread_barrier` in Triton 3.6, `barrier` from 3.7 (the same instruction).
thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# A TMA copy of a tensor descriptor's box into shared memory, completing on an mbarrier: `async_load` from 3.8 (3.9
# removed the old name).
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
# A cp.async copy of a pointer tensor's values into shared memory: `async_load` from 3.8 (3.9 removed the old name).
cp_async_load = async_copy.async_load if hasattr(async_copy, "async_load") else async_copy.async_copy_global_to_shared


@builtin
def reinterpret(buffer, dtype, shape, layout, _semantic=None):
    """The shared buffer `buffer` seen as `dtype` values of `shape` in `layout` (the same bytes): the method is
    `_reinterpret` up to Triton 3.8, `reinterpret` from 3.9. A builtin rather than a jit function, so that `shape`
    reaches the method unchanged (3.6 and 3.7 do not pass a shape list through a jit call as a constant)."""
    method = getattr(buffer, "reinterpret", None) or buffer._reinterpret
    return method(dtype, shape, layout, _semantic=_semantic)
