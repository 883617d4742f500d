"""The in-kernel timeline experiments' anchors still match the kernels they stamp (CPU: text only)."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EXPERIMENTS = ROOT / "benchmarks" / "experiments"


@pytest.mark.parametrize("tool, kernel, stamps", [("seesaw_timeline", "hopper_decode.py", 8),
                                                 ("prefill_timeline", "hopper_prefill.py", 8),
                                                 ("prefill_tile_phases", "hopper_prefill.py", 14)])
def test_stamped_copy_applies_every_edit(tool, kernel, stamps, tmp_path, monkeypatch):
    """Each tool's `stamp` finds every anchor once in today's kernel source, and the stamped module still parses
    with the stamp calls in it (a moved anchor stops the tool; this catches it before device time is spent)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    module = __import__(tool)
    try:
        module.stamp(tmp_path)
    finally:
        sys.modules.pop(tool, None)
    text = (tmp_path / "src" / "mlakit" / "kernels" / kernel).read_text()
    ast.parse(text)
    assert text.count("_stamp(TL, slot,") + text.count("_stamp(KV_SCALE, slot,") >= stamps
    assert (ROOT / "src" / "mlakit" / "kernels" / kernel).read_text().count("_stamp(") == 0
