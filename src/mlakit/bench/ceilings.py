"""The two ceilings every speed figure is reported against, measured in the same run."""

from __future__ import annotations

import dataclasses

import torch

from mlakit.bench.timing import median_ms, sustained_ms


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """Device-to-device copy bandwidth (bytes read + written) and bf16 matmul rate."""

    copy_gb_per_s: float
    matmul_tflop_per_s: float


def measure_ceilings(device: torch.device, copy_bytes: int = 1 << 30, matmul_n: int = 8192,
                     sustained: bool = False) -> Ceilings:
    """Times a large copy and an `n^3` bf16 matmul on random data: do_bench's median (`timing.median_ms`), or with
    `sustained` back to back once the clock has settled (`timing.sustained_ms`), as the calls compared with them."""
    src = torch.randn(copy_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    if sustained:
        copy_ms, matmul_ms = sustained_ms(lambda: dst.copy_(src)), sustained_ms(lambda: a @ b)
    else:
        copy_ms, matmul_ms = median_ms(lambda: dst.copy_(src), rep_ms=200), median_ms(lambda: a @ b, rep_ms=300)
    return Ceilings(
        copy_gb_per_s=2 * copy_bytes / copy_ms / 1e6,
        matmul_tflop_per_s=2 * matmul_n**3 / matmul_ms / 1e9,
    )
