"""CPU probe (no GPU): what Triton's Gluon compiles for sm_90a in a two-CTA cluster (num_ctas=2), the gate of issue
23's fp8 two-CTA conversion (NOTES.md, end of "The plan kernel under Triton 3.7"). Each CTA would convert
half of an e4m3 KV tile and the other CTA needs that half too, so the probe asks three things:

- multicast: one TMA copy of a tile into both CTAs' shared memory (`multicast=True`, a broadcast `cga_layout`);
- convert: a tensor split over the two CTAs (`cga_layout` [[1, 0]]: CTA 1 holds the second half of the rows) turned
  into one each CTA holds whole (`cga_layout` [[0, 0]]) by `convert_layout`: a cross-CTA exchange;
- store: the split tensor stored into a broadcast shared buffer (each CTA's rows into both CTAs' shared memory).

    python benchmarks/experiments/cluster_exchange_probe.py     # prints compiled / the compiler's first error a probe

Needs Triton 3.7 or later (cluster barriers, `multicast=`). Under 3.7.1: multicast compiles (a
`cp.async.bulk.tensor...multicast::cluster`); convert fails in the LLVM lowering ('nvvm.mapa' given a shared-memory
pointer where it takes a generic or cluster one); store is not lowered at all (`ttg.local_store` illegal). Under
3.8.0: all three compile, convert as a local store, a cluster barrier and `ld.shared::cluster` of the peer's half;
store without any remote store. Under 3.9.0 multicast fails (its TMA API moved), the others as under 3.8.0.
"""
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SPLIT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[1, 0]]))
WHOLE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]]))
SHARED = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, cga_layout=[[0, 0]]))


@gluon.jit
def multicast_probe(desc, Y):
    tile = gl.allocate_shared_memory(gl.float16, [64, 64], SHARED)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, 64 * 64 * 2)
    tma.async_copy_global_to_shared(desc, [0, 0], bar, tile, multicast=True)
    mbarrier.wait(bar, 0)
    gl.store(Y + gl.full([64, 64], 0, gl.int32, WHOLE), tile.load(WHOLE))


@gluon.jit
def convert_probe(X, Y):
    half = gl.full([64, 64], 1.0, gl.float16, SPLIT) * gl.load(X).to(gl.float16)
    gl.store(Y + gl.full([64, 64], 0, gl.int32, WHOLE), gl.convert_layout(half, WHOLE))


@gluon.jit
def store_probe(X, Y):
    half = gl.full([64, 64], 1.0, gl.float16, SPLIT) * gl.load(X).to(gl.float16)
    tile = gl.allocate_shared_memory(gl.float16, [64, 64], SHARED)
    tile.store(half)
    gl.barrier(cluster=True)
    gl.store(Y + gl.full([64, 64], 0, gl.int32, WHOLE), tile.load(WHOLE))


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """The process's standard error (file descriptor 2: MLIR prints its diagnostics there) into `path`."""
    saved = os.dup(2)
    with open(path, "w") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def outcome(check: object, kernel: object, arguments: list[object]) -> str:
    """`kernel` compiled for sm_90a in a two-CTA cluster: the cluster instructions of its PTX, or the compiler's
    first error line."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp, "stderr.txt")
        try:
            with stderr_to(log):
                ptx = check.compile_like_launch(kernel, arguments, {"num_ctas": 2, "num_warps": 4}).asm["ptx"]
        except Exception as exc:  # the compiler's own error is the probe's answer
            lines = (log.read_text() + str(exc)).splitlines()
            return f"failed: {next((line for line in lines if 'error' in line), str(exc)).strip()[:300]}"
    found = re.findall(r"\b(mapa\.\S+|[\w.:]*shared::cluster[\w.:]*|barrier\.cluster\.\w+)", ptx)
    return f"compiled; cluster instructions {sorted(set(found))}"


def main() -> None:
    sys.path.insert(0, str(SCRIPTS))
    import gluon_compile_check as check
    out = torch.empty(64, 64, dtype=torch.float16)
    scale = torch.empty(1, dtype=torch.float8_e4m3fn)
    desc = TensorDescriptor.from_tensor(torch.empty(64, 64, dtype=torch.float16), [64, 64], SHARED.value)
    for name, kernel, arguments in [("multicast", multicast_probe, [desc, out]),
                                    ("convert", convert_probe, [scale, out]), ("store", store_probe, [scale, out])]:
        print(f"{name}: {outcome(check, kernel, arguments)}")


if __name__ == "__main__":
    main()
