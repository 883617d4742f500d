"""Compiles a small marked or unmarked Gluon TMA kernel for sm_90a (no GPU needed) and prints what its PTX holds, as
one JSON line. tests/test_l2_evict_first.py runs it in a process of its own: Triton's CPU interpreter, which other
tests run, leaves the language patched for the rest of a process, and a Gluon kernel then no longer compiles there.

    python tests/evict_first_compile_worker.py MARKED PRINTS SCOPED      # each 0 or 1
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from mlakit.kernels.gluon_compat import tma_load
from mlakit.kernels.hopper_common import matrix_descriptor
from mlakit.kernels.l2_evict_first import evict_first_tma_loads, mark_evict_first
from mlakit.kernels.launch import ptx_rewritten

ROOT = Path(__file__).resolve().parents[1]


@gluon.jit
def tile_copy(DESC, OUT, MARKED: gl.constexpr, PRINTS: gl.constexpr):
    if MARKED:
        mark_evict_first()
    if PRINTS:  # a kernel with a local stack
        gl.device_print("program", gl.program_id(0))
    tile = gl.allocate_shared_memory(DESC.dtype, DESC.block_type.shape, DESC.layout)
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    mbarrier.expect(ready, DESC.block_type.nbytes)
    tma_load(DESC, [0, 0], ready, tile)
    mbarrier.wait(ready, 0)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, DESC.block_type.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, DESC.block_type.shape[1], layout=gl.SliceLayout(0, layout))
    gl.store(OUT + rows[:, None] * DESC.block_type.shape[1] + cols[None, :], tile.load(layout))


def compile_tile_copy(marked: bool, prints: bool) -> object:
    spec = importlib.util.spec_from_file_location("gluon_compile_check", ROOT / "scripts" / "gluon_compile_check.py")
    check = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = check  # its dataclass looks its module up there
    spec.loader.exec_module(check)
    source = torch.empty(64, 64, dtype=torch.bfloat16)
    desc = matrix_descriptor((source.data_ptr(), source.dtype, tuple(source.shape), tuple(source.stride())), (64, 64))
    out = torch.empty(64, 64, dtype=torch.bfloat16)
    return check.compile_like_launch(tile_copy, [desc, out], dict(MARKED=marked, PRINTS=prints, num_warps=4))


if __name__ == "__main__":
    marked, prints, scoped = (bool(int(flag)) for flag in sys.argv[1:4])
    try:
        with ptx_rewritten(evict_first_tma_loads if scoped else None):
            ptx = compile_tile_copy(marked, prints).asm["ptx"]
        result = {"loads": ptx.count("cp.async.bulk.tensor"), "hinted": ptx.count(".L2::cache_hint"),
                  "policies": ptx.count("createpolicy")}
    except Exception as exc:  # reported, with its causes, for the test to judge
        chain = [exc]
        while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
            chain.append(chain[-1].__cause__ or chain[-1].__context__)
        result = {"error": " | ".join(f"{type(e).__name__}: {e}" for e in chain)}
    print(json.dumps(result))
