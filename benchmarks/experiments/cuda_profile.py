"""Shared by the profiling experiments (`decode_kernel_breakdown.py`, `prefill_chunk_profile.py`, the decode A/Bs and
probes): CUDA time a call by kernel name, from torch.profiler, optionally with the L2 flushed before each call."""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_times(call: Callable[[], object], calls: int, name_width: int = 70) -> dict[str, tuple[float, int]]:
    """Microseconds of CUDA time a call and launches a call of each kernel (its name cut to `name_width`), over
    `calls` profiled calls after three warm-up calls."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:name_width]][0] += event.device_time / calls
            totals[event.name[:name_width]][1] += 1 / calls
    return {name: (us, round(n)) for name, (us, n) in totals.items()}


# Written before each call of `flushed_kernel_times` (twice the H100's and H200's L2).
L2_FLUSH_BYTES = 256 << 20


def flushed_kernel_times(call: Callable[[], object], calls: int = 20, name_width: int = 40) -> dict[str, float]:
    """`kernel_times`' microseconds a call per kernel with the L2 flushed (a 256 MB write) before each call, the
    flush's own kernel left out."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def flushed() -> None:
        flush.zero_()
        call()

    return {name: us for name, (us, _) in kernel_times(flushed, calls, name_width).items() if "elementwise" not in name}
