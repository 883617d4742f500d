"""Timing a call outside a CUDA graph: the host time per call and the eager time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

# Calls per host-time loop: few enough launches that the CUDA launch queue never fills (it holds about a
# thousand small launches, fewer with large arguments such as TMA descriptors: 400 prefill calls filled
# it on the H100), so that the loop measures the host and not the GPU.
CALLS = 100


def host_us_per_call(call: Callable[[], object], calls: int = CALLS, rounds: int = 9) -> float:
    """Host microseconds per call: the mean over `calls` back-to-back calls without a sync, the median of
    `rounds` such loops (a shared host's timings wander by tens of percent from loop to loop)."""
    call()
    means = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(calls):
            call()
        means.append((time.perf_counter() - began) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(means)


def eager_us(call: Callable[[], object]) -> float:
    """do_bench's median microseconds of the eager call."""
    from triton.testing import do_bench

    return do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3
