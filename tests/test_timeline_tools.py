"""The in-kernel timeline experiments' anchors still match the kernels they stamp (CPU: text only)."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EXPERIMENTS = ROOT / "benchmarks" / "experiments"


SEESAW_MODULES = ("hopper_decode/seesaw_kernel.py", "hopper_decode/seesaw_partitions.py")


@pytest.mark.parametrize("tool, kernels, stamps", [("seesaw_timeline", SEESAW_MODULES, 8),
                                                  ("prefill_timeline", ("hopper_prefill.py",), 8),
                                                  ("prefill_tile_phases", ("hopper_prefill.py",), 14),
                                                  ("narrow_timeline", ("hopper_narrow_decode.py",), 5)])
def test_stamped_copy_applies_every_edit(tool, kernels, stamps, tmp_path, monkeypatch):
    """Each tool's `stamp` finds every anchor once in today's kernel sources, and the stamped modules still parse
    with the stamp calls in them, each defining the `_stamp` it calls (a moved anchor stops the tool; this catches it
    before device time is spent)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    module = __import__(tool)
    try:
        module.stamp(tmp_path)
    finally:
        sys.modules.pop(tool, None)
    texts = [(tmp_path / "src" / "mlakit" / "kernels" / kernel).read_text() for kernel in kernels]
    for text in texts:
        ast.parse(text)
        assert "def _stamp(" in text
    assert sum(text.count("_stamp(TL, slot,") + text.count("_stamp(KV_SCALE, slot,") for text in texts) >= stamps
    assert all((ROOT / "src" / "mlakit" / "kernels" / kernel).read_text().count("_stamp(") == 0 for kernel in kernels)
