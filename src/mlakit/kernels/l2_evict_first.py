r"""L2 evict-first hints on a Gluon kernel's TMA tile loads.

A decode kernel reads each cache tile once, or a few times close together; loaded under the default L2 policy
the stream competes for L2 with data that is reused. PTX can tag a bulk tensor load with an L2 cache policy
(`.L2::cache_hint` and a policy from `createpolicy`), but Gluon's TMA copy (Triton 3.6 and 3.7) takes none. So a
kernel that calls `mark_evict_first()` carries a marker in its PTX, and `evict_first_tma_loads`, run on the PTX
as the kernel compiles (`CachedLaunch(kernel, ptx_rewrite=evict_first_tma_loads)`), gives each of its TMA tile
loads an evict-first policy made once at the kernel's entry. Kernels without the marker compile unchanged, so
a constexpr that decides the call decides the hint, and Triton's caches keep the two kernels apart.

>>> load = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2}], [%r2];"
>>> ptx = evict_first_tma_loads(f".entry k()\n{{\n\t.reg .b32 \t%r<3>;\n{MARK}\n\t{load}\n}}")
>>> hinted = load.replace("::bytes", "::bytes.L2::cache_hint").replace("];", "], %mlakit_evict_first;")
>>> "createpolicy.fractional.L2::evict_first" in ptx, hinted in ptx
(True, True)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Hashable
from pathlib import Path
from typing import NamedTuple

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

MARK = "// mlakit: L2 evict-first TMA loads"
# The decode kernels take the hint when at most this many row tiles read each cache tile: more readers find it in
# L2 less often (NOTES.md v58: 1-9% faster with one or two, mixed with four, level with eight).
EVICT_FIRST_MAX_ROW_TILES = 2
_POLICY = "%mlakit_evict_first"
_TMA_LOAD = re.compile(r"(cp\.async\.bulk\.tensor\.\dd\.shared::(?:cluster|cta)\.global\.mbarrier::complete_tx::bytes)"
                       r"( \[[^\]]+\], \[[^\]]+\], \[[^\]]+\]);")
# Any TMA load from global memory, in whatever form: each must be one `_TMA_LOAD` rewrites.
_ANY_TMA_LOAD = re.compile(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global")
# The entry's declarations (registers, and a local stack where the kernel has one), after which the policy is made.
_ENTRY_DECLARATIONS = re.compile(r"(\.entry [^{]*\{\n(?:\t\.(?:reg|local|shared) [^\n]+\n)+)")


class PtxRewriteError(RuntimeError):
    """The PTX of a marked kernel is not laid out as the rewrite expects (a Triton whose output changed)."""


def streams_evict_first(row_tiles: int) -> bool:
    """Whether a decode split pass whose every cache tile is read by `row_tiles` row tiles takes the hint.

    >>> streams_evict_first(1), streams_evict_first(4)
    (True, False)
    """
    return row_tiles <= EVICT_FIRST_MAX_ROW_TILES


class HintedKey(NamedTuple):
    """A `CachedLaunch` key of a kernel that may be marked: the call's other choices and whether its cache loads take
    the hint (`streams_evict_first`), so that the two compiled kernels stay apart and a key says which one it holds.

    >>> HintedKey(("layout", False), evict_first=True).evict_first
    True
    """

    choices: Hashable
    evict_first: bool


def evict_first_tma_loads(ptx: str) -> str:
    """`ptx` with every TMA tile load under an L2 evict-first policy if the kernel is marked (`mark_evict_first`),
    else unchanged. Raises `PtxRewriteError` for a marked kernel whose loads or entry it cannot find."""
    if MARK not in ptx:
        return ptx
    every_load = len(_ANY_TMA_LOAD.findall(ptx))
    ptx, loads = _TMA_LOAD.subn(rf"\1.L2::cache_hint\2, {_POLICY};", ptx)
    ptx, entries = _ENTRY_DECLARATIONS.subn(
        rf"\1\t.reg .b64 \t{_POLICY};\n\tcreatepolicy.fractional.L2::evict_first.b64 \t{_POLICY}, 1.0;\n", ptx, count=1)
    if not loads or loads != every_load or entries != 1:
        raise PtxRewriteError(f"a kernel marked for evict-first TMA loads: {loads} of its {every_load} TMA loads in a "
                              f"form the rewrite knows and {entries} entry declaration block(s) in its PTX, expected "
                              f"every load (at least one) and one entry")
    return ptx


# The marker names this module's source by digest, so that Triton's caches, which key a kernel by its source,
# never hand out a kernel rewritten by an older form of the rewrite; and it reads the policy register, which only
# the rewrite declares, so a marked kernel compiled without the rewrite (outside `launch.ptx_rewritten`) fails in
# ptxas instead of running, and caching, unhinted.
_MARK_ASM = gl.constexpr(f"{MARK} {hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]}\n"
                         f"{{\n.reg .b64 policy;\nmov.b64 policy, {_POLICY};\n}}\n mov.u32 $0, 0;")


@gluon.jit
def mark_evict_first():
    """Marks the kernel calling it for `evict_first_tma_loads` (a comment in its PTX; it executes one `mov`)."""
    # Inline assembly needs an operand: the program id stands in.
    gl.inline_asm_elementwise(_MARK_ASM, "=r,r", [gl.program_id(0)], dtype=gl.int32, is_pure=False, pack=1)
