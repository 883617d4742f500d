"""Every plain Triton kernel of mlakit the CPU tests launch, compiled for sm_90a (no GPU) and checked for predicated
warp collectives (`scripts/gluon_compile_check.py`'s `predicated_warp_collectives`: the ptxas fault that made the
plan kernel count its items short under Triton 3.7.1, NOTES.md "The plan kernel under Triton 3.7").

    python benchmarks/experiments/triton_kernel_scan.py record LAUNCHES.json [PYTEST ARGS...]
    python benchmarks/experiments/triton_kernel_scan.py compile LAUNCHES.json

`record` runs the tests under the CPU interpreter and keeps one launch per kernel and set of constants (argument
dtypes, 16-byte alignment and scalar values as launched); `compile` builds each of them as a GPU launch would
specialize it, in a process without the interpreter, and prints one line each, failing on any predicated collective.
The interpreter's own tiers pick the constants, so the Hopper tier's builds are the compile test's and `--scan-cache`'s.
"""
from __future__ import annotations

import collections
import importlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _described(value: object) -> object:
    """A launch argument as JSON: a tensor by dtype and alignment, a Triton dtype by name, a scalar as itself."""
    import torch
    import triton.language as tl

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": value.data_ptr() % 16 == 0}
    if isinstance(value, tl.dtype):
        return {"tl_dtype": value.name}
    if isinstance(value, tl.constexpr):
        return _described(value.value)
    if isinstance(value, tuple):
        return {"tuple": [_described(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(type(value).__name__)


def record(out: Path, pytest_args: list[str]) -> int:
    """The tests' launches of mlakit's Triton kernels, one per kernel and constants, into `out`."""
    os.environ["TRITON_INTERPRET"] = "1"
    import pytest
    from triton.runtime.interpreter import InterpretedFunction

    launches: dict[str, dict] = {}
    skipped: collections.Counter[str] = collections.Counter()
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if self.fn.__module__.startswith("mlakit."):
            try:
                entry = {"module": self.fn.__module__, "name": self.fn.__name__,
                         "args": [_described(a) for a in args],
                         "kwargs": {k: _described(v) for k, v in kwargs.items()}}
                key = json.dumps([entry["module"], entry["name"], entry["kwargs"]], sort_keys=True)
                launches.setdefault(key, entry)
            except TypeError as exc:
                skipped[f"{self.fn.__name__}: {exc}"] += 1
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    status = pytest.main(["-q", "-p", "no:cacheprovider", *pytest_args])
    out.write_text(json.dumps(list(launches.values()), indent=1))
    print(f"{len(launches)} launches recorded; not recorded (an argument of that type): {dict(skipped)}")
    return int(status)


def _rebuilt(value: object) -> object:
    """A stand-in for a `_described` argument: a CPU tensor of its dtype and alignment, the Triton dtype, the value."""
    import torch
    import triton.language as tl

    if isinstance(value, dict) and "tensor" in value:
        dtype = getattr(torch, value["tensor"])
        return torch.empty(64, dtype=dtype) if value["aligned"] else torch.empty(65, dtype=dtype)[1:]
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_rebuilt(v) for v in value["tuple"])
    if isinstance(value, dict) and "tl_dtype" in value:
        return tl.dtype(value["tl_dtype"])
    return value


def compile_all(launches_file: Path) -> int:
    """Each recorded launch compiled for sm_90a: its predicated warp collectives, or the compiler's error."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gluon_compile_check as check
    found = 0
    for entry in json.loads(launches_file.read_text()):
        kernel = getattr(importlib.import_module(entry["module"]), entry["name"])
        args = [_rebuilt(a) for a in entry["args"]]
        kwargs = {k: _rebuilt(v) for k, v in entry["kwargs"].items()}
        try:
            compiled = check.compile_like_launch(kernel, args, kwargs)
            predicated = check.predicated_warp_collectives(check.disassembly(compiled))
            found += bool(predicated)
            line = check.predicated_summary(predicated)
        except Exception as exc:  # a launch the stand-ins cannot rebuild is reported, not fatal
            line = f"not compiled: {type(exc).__name__}: {str(exc).splitlines()[-1][:200] if str(exc) else ''}"
        constants = {k: v for k, v in entry["kwargs"].items() if k.isupper()}
        print(f"{entry['module'].removeprefix('mlakit.')}.{entry['name']}: {line}; {constants}")
    return 1 if found else 0


if __name__ == "__main__":
    mode, path = sys.argv[1], Path(sys.argv[2])
    sys.exit(record(path, sys.argv[3:]) if mode == "record" else compile_all(path))
