"""Shared by the in-kernel timeline experiments (`seesaw_timeline.py`, `prefill_timeline.py`): a copy of src/
whose kernel modules have globaltimer stamps inserted at named anchors.

A stamped kernel gets `_stamp(TL, slot, event)` (the globaltimer, in ns, into int64 `TL[slot * EVENTS + event]`;
a negative slot records nothing) and `_record(TL, slot, event, value)` (a value instead of a time), where EVENTS is
the experiment's events per slot.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path


def stamp_functions(events: int) -> str:
    """The Gluon source of `_stamp` and `_record` for `events` events a slot, to insert before a kernel function."""
    return f'''@gluon.jit
def _stamp(TL, slot, event: gl.constexpr):
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [slot], dtype=gl.int64, is_pure=False, pack=1)
    if slot >= 0:
        gl.store(TL + slot * {events} + event, t)


@gluon.jit
def _record(TL, slot, event: gl.constexpr, value):
    if slot >= 0:
        gl.store(TL + slot * {events} + event, value.to(gl.int64))


'''


def stamped_copy(destination: Path, edits: dict[str, tuple[tuple[str, str], ...]]) -> Path:
    """Copies src/ to `destination`/src and applies `edits` to its modules: per module (a path under
    src/mlakit/kernels), (anchor, replacement) pairs, in order; each anchor must occur exactly once in its module, or
    it stops naming the anchor (the kernel's text moved: update the anchors)."""
    target = destination / "src"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(Path("src"), target, ignore=shutil.ignore_patterns("__pycache__"))
    for kernel, pairs in edits.items():
        path = target / "mlakit" / "kernels" / kernel
        text = path.read_text()
        for anchor, replacement in pairs:
            if text.count(anchor) != 1:
                raise SystemExit(f"anchor found {text.count(anchor)} times in {kernel} (expected once): {anchor!r}")
            text = text.replace(anchor, replacement)
        path.write_text(text)
    print(f"stamped copy in {target}")
    return target


def main(doc: str, stamp: Callable[[Path], None], run: Callable[[list[str]], None]) -> None:
    """A timeline tool's command line: `stamp DESTINATION` or `run CASE ...`, else its usage (`doc`)."""
    if len(sys.argv) >= 3 and sys.argv[1] == "stamp":
        stamp(Path(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2:])
    else:
        raise SystemExit(doc)
