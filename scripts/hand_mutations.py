"""A small hand mutation check of the test suite (TESTING.md, "Mutation check").

Each mutation below is a deliberate bug in one line of reference.py, cache/kv_quant.py,
attention/checks.py, cache/paged.py, config/hf.py or the Triton decode kernel. For each, the
script copies src/, tests/, conftest.py and pyproject.toml into a temporary directory, applies
the mutation there (never to the working tree), runs the tests that should catch it and counts
it killed (a test failed) or survived. Run from the repository root:

    .venv/bin/python scripts/hand_mutations.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Mutation:
    """Replace `old` (which must occur exactly once) by `new` in `path`; `tests` should fail."""

    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    label: str


KV = "src/mlakit/cache/kv_quant.py"
CHECKS = "src/mlakit/attention/checks.py"
PAGED = "src/mlakit/cache/paged.py"
HF = "src/mlakit/config/hf.py"
REF = "src/mlakit/reference.py"
FP8_TESTS = ("tests/test_fp8_oracle.py", "tests/test_cache.py", "tests/test_api.py")
CHECK_TESTS = ("tests/test_checks.py",)
CONFIG_TESTS = ("tests/test_config_hf.py", "tests/test_shape.py", "tests/test_fuzz_model.py")

MUTATIONS = [
    Mutation(REF, "rows = torch.where(key_used[..., None], rows, 0)", "rows = rows",
             ("tests/test_reference.py", "tests/test_api.py"), "reference: NaN garbage in unused slots reaches the result"),
    Mutation(REF, "scale = kv_scale[table] if per_group_scale else kv_scale", "scale = kv_scale[table][..., :1] if per_group_scale else kv_scale",
             ("tests/test_reference.py", "tests/test_api.py", "tests/test_cache.py"), "reference: group 0's scale for every group"),
    Mutation(REF, "probs = torch.exp(scores - finite_lse[..., None])", "probs = torch.exp(scores - finite_lse[..., None]) * 0.999",
             ("tests/test_reference.py", "tests/test_api.py"), "reference: probabilities off by 0.1%"),
    Mutation(KV, "amax = torch.where(finite, grouped.abs(), 0).amax(dim=-1)", "amax = grouped.abs().amax(dim=-1)",
             FP8_TESTS, "kv_quant: one inf sets its group's scale"),
    Mutation(KV, "scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))", "scales = torch.where(amax > 0, amax / 440.0, torch.ones_like(amax))",
             FP8_TESTS, "kv_quant: per-group scale maps amax to 440, not 448"),
    Mutation(KV, "return torch.where(finite, scaled.clamp(-FP8_MAX, FP8_MAX), torch.nan).to(FP8_DTYPE)",
             "return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)", FP8_TESTS, "kv_quant: non-finite inputs stored as +-448"),
    Mutation(KV, "expanded = scale.to(dtype).repeat_interleave(SCALE_GROUP, dim=-1)[..., :dim]",
             "expanded = scale.to(dtype)[..., :1]", FP8_TESTS, "kv_quant: dequantize with group 0's scale"),
    Mutation(KV, "saturated = (finite & (scaled.abs() >= FP8_SATURATION)).sum()", "saturated = (finite & (scaled.abs() > FP8_MAX)).sum()",
             ("tests/test_cache.py", "tests/test_fp8_scales.py"), "kv_quant: saturation counted from 448, not 464"),
    Mutation(CHECKS, "        if shortest < 0:\n", "        if False:\n", CHECK_TESTS, "checks: non-decreasing cu_seqlens_q check deleted"),
    Mutation(CHECKS, "if batch == 0 or q_len == 0 or heads == 0:", "if batch == 0 or q_len == 0:", CHECK_TESTS, "checks: zero heads accepted"),
    Mutation(CHECKS, "if num_pages == 0 or page_size == 0:", "if num_pages == 0:", CHECK_TESTS, "checks: zero-token pages accepted"),
    Mutation(CHECKS, "not 0 < kv_lora_rank < dim", "not 0 < kv_lora_rank <= dim", CHECK_TESTS, "checks: kv_lora_rank = dim accepted"),
    Mutation(CHECKS, "or kv_scale.dtype != torch.float32:", "or False:", CHECK_TESTS, "checks: kv_scale dtype unchecked"),
    Mutation(CHECKS, "    if kv_scale.device != device:\n", "    if False:\n", CHECK_TESTS, "checks: kv_scale device unchecked"),
    Mutation(PAGED, "elif self._is_free[page] or page in seen:", "elif self._is_free[page]:", ("tests/test_cache.py",),
             "paged: a page listed twice in one free"),
    Mutation(PAGED, "if not is_int(page) or not 0 <= page < self.num_pages:", "if not is_int(page) or not 0 <= page <= self.num_pages:",
             ("tests/test_cache.py",), "paged: page num_pages accepted"),
    Mutation(HF, "or not math.isfinite(value) or value <= above:", "or value <= above:", CONFIG_TESTS, "config: NaN/inf numbers accepted"),
    Mutation(HF, 'needs_factor = rope_type == "yarn" or mscale_all_dim is not None', "needs_factor = False", CONFIG_TESTS,
             "config: YaRN without factor defaults to 1.0"),
    Mutation(HF, "if rope_dim % 2:", "if False:", CONFIG_TESTS, "config: odd rope dim accepted by check"),
    Mutation(HF, "if not is_int(value) or value < minimum:", "if not is_int(value) or value < minimum - 1:", CONFIG_TESTS,
             "config: integers one below the minimum accepted"),
    Mutation("src/mlakit/kernels/triton_decode.py", "group = (COL_OFFSET + cols) // SCALE_GROUP_SIZE", "group = (COL_OFFSET + cols) * 0",
             ("tests/test_triton_decode.py",), "triton kernel: group 0's scale for every channel"),
]


def copy_tree(root: Path, copy: Path) -> None:
    """What the tests need of the repository at `root` (src/, tests/, the experiments some tests import,
    conftest.py, pyproject.toml), into `copy`."""
    for item in ("src", "tests", "benchmarks/experiments"):
        shutil.copytree(root / item, copy / item, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for item in ("conftest.py", "pyproject.toml"):
        shutil.copy(root / item, copy / item)


def run(mutation: Mutation, root: Path, timeout: float) -> tuple[bool, float]:
    """(killed, seconds) of one mutation, tested in a temporary copy of the tree (`old == new`: the
    unmutated baseline, which must pass)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        copy_tree(root, copy)
        target = copy / mutation.path
        source = target.read_text()
        if source.count(mutation.old) != 1:
            raise SystemExit(f"{mutation.label}: expected one occurrence of {mutation.old!r} in {mutation.path}, found {source.count(mutation.old)}")
        target.write_text(source.replace(mutation.old, mutation.new))
        began = time.perf_counter()
        env = os.environ | {"PYTHONPATH": str(copy / "src")}
        try:
            result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutation.tests],
                                    cwd=copy, env=env, capture_output=True, timeout=timeout)
            killed = result.returncode != 0
        except subprocess.TimeoutExpired:
            killed = True  # a hang is caught too
        return killed, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the mutations whose label contains this")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    root = Path.cwd()
    chosen = [m for m in MUTATIONS if args.only in m.label]
    for path, tests in sorted({(m.path, m.tests) for m in chosen}):
        line = next(line for line in (root / path).read_text().splitlines() if line.strip())
        failed, _ = run(Mutation(path, line, line, tests, "baseline"), root, args.timeout)
        if failed:
            raise SystemExit(f"the unmutated tree fails {list(tests)}: fix that first")
    survivors = []
    for mutation in chosen:
        killed, seconds = run(mutation, root, args.timeout)
        print(f"{'killed  ' if killed else 'SURVIVED'} {seconds:5.1f}s  {mutation.label}", flush=True)
        if not killed:
            survivors.append(mutation.label)
    print(f"score: {len(chosen) - len(survivors)}/{len(chosen)} killed; survivors: {survivors or 'none'}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
