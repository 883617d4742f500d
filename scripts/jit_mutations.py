"""mutmut's mutations of one `@triton.jit` kernel, which mutmut itself skips (TESTING.md, "Mutation check").

mutmut 3 never mutates a decorated function: its trampolines replace the function by a Python
dispatcher, and Triton compiles the function's source. This script applies mutmut's own mutation
operators (`mutmut.mutation.file_mutation.create_mutations`) to the body of the kernel named,
writes each mutant into a temporary copy of the tree (src/, tests/, conftest.py, pyproject.toml;
never the working tree) and runs the given tests there, under the CPU interpreter where there is
no GPU. A test failure, crash or timeout kills the mutant. Run from the repository root:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/jit_mutations.py src/mlakit/kernels/rank_merge.py \\
        _merge_partials_kernel tests/test_rank_merge.py "tests/test_exchange.py -k triton"

Each argument after the kernel's name is one pytest invocation's arguments (split on spaces); a
mutant is killed when any of them fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import os
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import libcst as cst

from hand_mutations import copy_tree
from mutmut.mutation.file_mutation import create_mutations, deep_replace

# mutmut reads [tool.mutmut] when it first mutates and warns about the key names pyproject.toml keeps.
warnings.filterwarnings("ignore", message="The config .* is deprecated")


def mutants(source: str, kernel: str) -> list[str]:
    """Every distinct source of the file with one mutmut mutation in `kernel`'s body."""
    module = cst.parse_module(source)
    found = [node for node in module.body if isinstance(node, cst.FunctionDef) and node.name.value == kernel]
    if len(found) != 1:
        raise SystemExit(f"expected one top-level function {kernel}, found {len(found)}")
    function = found[0]
    # Without its decorators, so that mutmut does not skip it; they are put back on every mutant.
    bare, mutations, _, _ = create_mutations("kernel.py", cst.Module(body=[function.with_changes(decorators=[])]).code)
    sources = []
    for mutation in mutations:
        mutated = deep_replace(bare, mutation.original_node, mutation.mutated_node).body[0]
        mutated = mutated.with_changes(decorators=function.decorators, leading_lines=function.leading_lines)
        text = module.deep_replace(function, mutated).code
        if text != source and text not in sources:
            sources.append(text)
    return sources


def run(root: Path, path: str, text: str, invocations: list[list[str]], timeout: float) -> tuple[str, float]:
    """('killed' | 'timeout' | 'survived', seconds) of one mutant's tests in a temporary copy of the tree."""
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        copy_tree(root, copy)
        (copy / path).write_text(text)
        env = os.environ | {"PYTHONPATH": str(copy / "src")}
        for args in invocations:
            try:
                result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args],
                                        cwd=copy, env=env, capture_output=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return "timeout", time.perf_counter() - began
            if result.returncode != 0:
                return "killed", time.perf_counter() - began
    return "survived", time.perf_counter() - began


def changed_lines(before: str, after: str) -> str:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return "\n".join(f"      {line}" for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the kernel's file, relative to the repository root")
    parser.add_argument("kernel", help="the @triton.jit function's name")
    parser.add_argument("tests", nargs="+", help="pytest arguments, one invocation per argument")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    root = Path.cwd()
    source = (root / args.path).read_text()
    invocations = [shlex.split(tests) for tests in args.tests]
    baseline, _ = run(root, args.path, source, invocations, args.timeout)
    if baseline != "survived":
        raise SystemExit(f"the unmutated tree fails {args.tests} ({baseline}): fix that first")
    texts = mutants(source, args.kernel)
    print(f"{len(texts)} mutants of {args.kernel}", flush=True)
    counts = {"killed": 0, "timeout": 0, "survived": 0}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run, root, args.path, text, invocations, args.timeout) for text in texts]
        for number, (text, future) in enumerate(zip(texts, futures), 1):
            verdict, seconds = future.result()
            counts[verdict] += 1
            print(f"{number:3d} {verdict:8s} {seconds:5.1f}s\n{changed_lines(source, text)}", flush=True)
    print(f"{len(texts)} mutants: {counts['killed']} killed, {counts['timeout']} timed out, {counts['survived']} survived")
    return 1 if counts["survived"] else 0


if __name__ == "__main__":
    sys.exit(main())
