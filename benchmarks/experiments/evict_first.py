"""Experiments' L2 evict-first hint on TMA loads (FlashMLA's K and Q loads carry one; Gluon 3.6's TMA copy takes
none): a compiled kernel's PTX gets `.L2::cache_hint` on every TMA tile load, with one
`createpolicy.fractional.L2::evict_first` policy made at the entry, and is assembled again by Triton's ptxas before
the kernel's first launch. `patch(compiled)` does it to one compiled kernel, `install(names)` to every kernel whose
name contains one of `names` as Triton compiles it (a post-compile hook). Experiments only (NOTES.md, "FlashMLA and
our decode kernel by kernel")."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from triton import knobs
from triton.backends.nvidia.compiler import get_ptxas

POLICY = "%evict_first_policy"
TMA_LOAD = re.compile(r"(cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.mbarrier::complete_tx::bytes)"
                      r"( \[[^\]]+\], \[[^\]]+\], \[[^\]]+\]);")
ENTRY_REGISTERS = re.compile(r"(\.entry [^{]*\{\n(?:\t\.reg [^\n]+\n)+)")


def with_evict_first(ptx: str) -> str:
    """The PTX with every TMA tile load carrying the evict-first policy operand."""
    ptx, loads = TMA_LOAD.subn(rf"\1.L2::cache_hint\2, {POLICY};", ptx)
    ptx, entries = ENTRY_REGISTERS.subn(
        rf"\1\t.reg .b64 \t{POLICY};\n\tcreatepolicy.fractional.L2::evict_first.b64 \t{POLICY}, 1.0;\n", ptx, count=1)
    assert loads and entries == 1, (loads, entries)
    return ptx


def assemble(ptx: str) -> bytes:
    """sm_90a cubin of `ptx` by Triton's own ptxas."""
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        source.write_text(ptx)
        subprocess.run([get_ptxas(90).path, "--gpu-name=sm_90a", "-o", str(binary), str(source)], check=True)
        return binary.read_bytes()


def patch(compiled: object) -> None:
    """`compiled` (not launched yet) runs its TMA loads with the hint."""
    assert compiled.module is None, "patch a kernel before its first launch"
    compiled.kernel = assemble(with_evict_first(compiled.asm["ptx"]))


def install(names: Iterable[str]) -> None:
    """Every kernel Triton compiles from now on whose name contains one of `names` gets the hint."""
    names = tuple(names)

    def hook(*, key, fn, compile, **_) -> None:
        if any(name in fn.name for name in names):
            patch(fn.jit_function.device_caches[compile["device"]][0][key])

    knobs.runtime.jit_post_compile_hook = hook
