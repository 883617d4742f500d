"""scripts/build_flashmla.py without compiling: its source checks and build plan (the build itself
runs on a GPU machine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("build_flashmla", ROOT / "scripts" / "build_flashmla.py")
build_flashmla = sys.modules.setdefault("build_flashmla", importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(build_flashmla)
EXPORTED_SOURCES = ROOT / ".device" / "flashmla-src"


def fake_tree(root: Path, *, cutlass: bool) -> Path:
    names = build_flashmla.REQUIRED_FILES + build_flashmla.KERNEL_SOURCES + (build_flashmla.FP16_SOURCE,)
    for name in names:
        if cutlass or not name.startswith("csrc/cutlass/"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("")
    return root


def test_plan_lists_the_dense_decode_sources_and_sm90a(tmp_path):
    plan = build_flashmla.make_plan(fake_tree(tmp_path / "src", cutlass=True), tmp_path / "out", jobs=3, fp16=False)
    assert [path.name for path in plan.sources] == ["flash_mla_dense_api.cpp", "get_decoding_sched_meta.cu", "combine.cu", "bf16.cu"]
    assert all(path.is_dir() or not path.exists() for path in plan.include_dirs)
    assert "arch=compute_90a,code=sm_90a" in plan.nvcc_flags and "-std=c++20" in plan.cxx_flags
    assert "-DFLASH_MLA_DISABLE_FP16" in plan.nvcc_flags and "-DFLASH_MLA_DISABLE_FP16" in plan.cxx_flags


def test_missing_cutlass_is_named_with_its_fix(tmp_path):
    with pytest.raises(build_flashmla.BuildError, match="missing csrc/cutlass/include/cutlass/cutlass.h.*csrc/cutlass is empty"):
        build_flashmla.make_plan(fake_tree(tmp_path, cutlass=False), tmp_path / "out", jobs=1, fp16=True)


def test_not_a_source_tree_exits_1_with_a_message(tmp_path, capsys):
    assert build_flashmla.main([str(tmp_path), str(tmp_path / "out")]) == 1
    assert "is not a FlashMLA source tree: missing flash_mla/__init__.py" in capsys.readouterr().err


@pytest.mark.skipif(not EXPORTED_SOURCES.is_dir(), reason="the FlashMLA sources are not exported to .device/flashmla-src")
def test_dry_run_on_the_exported_sources(tmp_path, capsys):
    assert build_flashmla.main([str(EXPORTED_SOURCES), str(tmp_path), "--dry-run"]) == 0
    assert "fp16.cu" in capsys.readouterr().out
