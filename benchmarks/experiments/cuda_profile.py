"""Shared by the profiling experiments (`decode_kernel_breakdown.py`, `prefill_chunk_profile.py`): CUDA time a
call by kernel name, from torch.profiler."""

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
