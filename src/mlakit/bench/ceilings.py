"""The two ceilings every speed figure is reported against, measured in the same run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from mlakit.bench.timing import median_ms


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """Device-to-device copy bandwidth (bytes read + written) and bf16 matmul rate."""

    copy_gb_per_s: float
    matmul_tflop_per_s: float


def measure_ceilings(device: torch.device, copy_bytes: int = 1 << 30, matmul_n: int = 8192,
                     time_ms: Callable[[Callable[[], object]], float] = median_ms) -> Ceilings:
    """Times a large copy and an `n^3` bf16 matmul on random data with `time_ms` (`timing.median_ms` or
    `timing.sustained_ms`: the ceilings timed as the calls they are compared with)."""
    src = torch.randn(copy_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    matmul_ms = time_ms(lambda: a @ b)
    return Ceilings(
        copy_gb_per_s=2 * copy_bytes / copy_ms / 1e6,
        matmul_tflop_per_s=2 * matmul_n**3 / matmul_ms / 1e9,
    )
