"""CPU experiment (Triton 3.6 side install, no GPU): does Triton's barrier analysis tell mbarrier views of one
allocation apart? Two tiny Gluon kernels expect, TMA-load and wait on 4 chunks: barriers as views of one allocation vs
4 allocations; prints the warpgroup bar.sync count of each. Run: PYTHONPATH=/path/to/triton-3.6:src python benchmarks/experiments/membar_probe.py"""
import re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, fence_async_shared
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from mlakit.kernels.hopper_common import matrix_descriptor

@gluon.jit
def one_alloc(DESC, OUT):
    smem = gl.allocate_shared_memory(gl.bfloat16, [4, 64, 64], DESC.layout)
    bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(4):
        mbarrier.init(bars.index(c), count=1)
    fence_async_shared()
    for c in gl.static_range(4):
        mbarrier.expect(bars.index(c), DESC.block_type.nbytes)
        tma.async_copy_global_to_shared(DESC, [0, c * 64], bars.index(c), smem.index(c))
    for c in gl.static_range(4):
        mbarrier.wait(bars.index(c), 0)

@gluon.jit
def four_allocs(DESC, OUT):
    smem = gl.allocate_shared_memory(gl.bfloat16, [4, 64, 64], DESC.layout)
    b0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    b1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    b2 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    b3 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = (b0, b1, b2, b3)
    for c in gl.static_range(4):
        mbarrier.init(bars[c], count=1)
    fence_async_shared()
    for c in gl.static_range(4):
        mbarrier.expect(bars[c], DESC.block_type.nbytes)
        tma.async_copy_global_to_shared(DESC, [0, c * 64], bars[c], smem.index(c))
    for c in gl.static_range(4):
        mbarrier.wait(bars[c], 0)

desc = matrix_descriptor((1 << 20, torch.bfloat16, (256, 576), (576, 1)), (64, 64))
out = torch.empty(16, dtype=torch.int32)
for fn in (one_alloc, four_allocs):
    names = [p.name for p in fn.params]
    vals = dict(DESC=desc, OUT=out)
    sig = {n: mangle_type(vals[n]) for n in names}
    k = triton.compile(GluonASTSource(fn, sig, {}, {(1,): [["tt.divisibility", 16]]}), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    ptx = k.asm["ptx"]
    print(fn.__name__, "bar.sync:", len(re.findall(r"\bbar\.sync\b", ptx)), "barrier.sync:", len(re.findall(r"\bbarrier\.sync\b", ptx)))
