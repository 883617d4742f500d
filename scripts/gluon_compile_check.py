#!/usr/bin/env python3
"""Compiles the Hopper prefill kernel (`mlakit.kernels.hopper_prefill`) for sm_90a without a GPU and
reports, per configuration, registers per thread, spills and shared memory (ptxas -v).

    python scripts/gluon_compile_check.py                      # with the installed triton
    python scripts/gluon_compile_check.py --kernel hopper_persistent   # the persistent form (or: both)
    PYTHONPATH=/path/to/triton-3.6/site-packages python scripts/gluon_compile_check.py   # the device's version

Gluon kernels do not run under the CPU interpreter; this catches what the compiler refuses (layouts,
shapes, shared memory over the limit) and register spills before device time is spent.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from mlakit.kernels import hopper_prefill as hp
from mlakit.kernels.hopper_common import matrix_descriptor

SM90 = GPUTarget("cuda", 90, 32)
CONSTEXPRS = ("NOPE_DIM", "ROPE_DIM", "V_DIM", "BLOCK_N", "STAGES", "CAUSAL", "MERGE", "Q_BUFFERS")


def _arguments(nope: int, rope: int, v_dim: int, block_n: int, dtype: torch.dtype) -> list[object]:
    """Stand-ins for the kernel's runtime arguments (a 16-head batch of CPU tensors: only dtypes and
    the descriptors' boxes matter for the signature)."""
    heads, tokens = 16, 256
    q = torch.empty(tokens, heads, nope + rope, dtype=dtype)
    kv = torch.empty(tokens, heads, nope + v_dim, dtype=dtype)
    k_pe = torch.empty(tokens, rope, dtype=dtype)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    descriptors = [
        matrix_descriptor(hp.head_rows(q), (64, min(hp.TMA_COLUMNS, nope))),
        matrix_descriptor(hp.head_rows(q), (64, rope)),
        matrix_descriptor(hp.head_rows(k_nope), (block_n, min(hp.TMA_COLUMNS, nope))),
        matrix_descriptor(hp.head_rows(k_pe), (block_n, rope)),
        matrix_descriptor(hp.head_rows(v), (block_n, min(hp.TMA_COLUMNS, v_dim))),
    ]
    out = torch.empty(tokens, heads, v_dim, dtype=dtype)
    lse = torch.empty(tokens, heads)
    cu = torch.zeros(3, dtype=torch.int32)
    return [*descriptors, out, lse, cu, cu, 0.5, q.stride(1), k_nope.stride(1), v.stride(1), out.stride(0),
            out.stride(1), lse.stride(0)]


# The kernels by `PrefillTuning.kernel` name, and the persistent one's schedule arguments (units, row blocks,
# heads, head group: unspecialized, any values do) and its int32 unit counter.
KERNELS = {"hopper": hp.mha_prefill_hopper_kernel, "hopper_persistent": hp.mha_prefill_hopper_persistent_kernel}
SCHEDULE = [1000, 10, 100, 7, torch.zeros(1, dtype=torch.int32)]


def compile_one(nope: int, rope: int, v_dim: int, block_n: int, stages: int, causal: bool, merge: bool,
                dtype: torch.dtype, kernel: str = "hopper") -> str:
    """One configuration compiled to a cubin; its ptxas resource line (or the compiler's error)."""
    fn = KERNELS[kernel]
    names = [p.name for p in fn.params]
    runtime = [n for n in names if n not in CONSTEXPRS]
    arguments = _arguments(nope, rope, v_dim, block_n, dtype) + (SCHEDULE if kernel == "hopper_persistent" else [])
    values = dict(zip(runtime, arguments, strict=True))
    constexprs = dict(NOPE_DIM=nope, ROPE_DIM=rope, V_DIM=v_dim, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                      MERGE=merge)
    if kernel == "hopper_persistent":
        constexprs["Q_BUFFERS"] = hp.q_buffers(nope, rope, v_dim, block_n, stages)
    signature = {n: "constexpr" if n in constexprs else mangle_type(values[n]) for n in names}
    source = GluonASTSource(fn, signature, {(names.index(n),): v for n, v in constexprs.items()})
    try:
        kernel = triton.compile(source, target=SM90, options={"num_warps": 4})
    except Exception as exc:  # the compiler's own message is the report: the innermost of the chain
        while exc.__cause__ is not None or exc.__context__ is not None:
            exc = exc.__cause__ or exc.__context__
        return f"FAILED: {type(exc).__name__}: {str(exc)[-1500:]}"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp, "k.ptx")
        ptx.write_text(kernel.asm["ptx"])
        report = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(tmp, "k.cubin"))],
                                capture_output=True, text=True).stderr
    used = re.findall(r"Used (\d+) registers", report)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return f"ok: shared {kernel.metadata.shared} B, registers {used}, spills (stores, loads) {spills}"


@click.command()
@click.option("--dims", default="128,64,128;64,32,64", show_default=True, help="nope,rope,v sets, ';'-separated")
@click.option("--block-n", "block_ns", default="64,128", show_default=True)
@click.option("--stages", "stage_counts", default="2,3", show_default=True)
@click.option("--kernel", "kernel_name", type=click.Choice([*KERNELS, "both"]), default="hopper", show_default=True)
def main(dims: str, block_ns: str, stage_counts: str, kernel_name: str) -> None:
    print(f"triton {triton.__version__}")
    failed = False
    for spec, block_n, stages in itertools.product(dims.split(";"), map(int, block_ns.split(",")),
                                                   map(int, stage_counts.split(","))):
        nope, rope, v_dim = map(int, spec.split(","))
        shape = f"nope {nope} rope {rope} v {v_dim} block_n {block_n} stages {stages}"
        if hp.shared_bytes(nope, rope, v_dim, block_n, stages) > hp.SHARED_MEMORY_LIMIT or stages < 2:
            print(f"{shape}: refused by plan_launch (stages < 2 or shared memory over {hp.SHARED_MEMORY_LIMIT} B)")
            continue
        for kernel, causal, merge in itertools.product(list(KERNELS) if kernel_name == "both" else [kernel_name],
                                                       (True, False), (False, True)):
            line = compile_one(nope, rope, v_dim, block_n, stages, causal, merge, torch.bfloat16, kernel)
            failed |= line.startswith("FAILED")
            print(f"{kernel} {shape} causal {causal} merge {merge}: {line}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
