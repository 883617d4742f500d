"""Timing a call outside a CUDA graph: the host time per call, the eager time (L2 flushed before each call), the
time with a clean L2 before each call, and the sustained time (back to back, the clock settled)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

# Calls per host-time loop: few enough launches that the CUDA launch queue never fills (it holds about a
# thousand small launches, fewer with large arguments such as TMA descriptors: 400 prefill calls filled
# it on the H100), so that the loop measures the host and not the GPU.
CALLS = 100
# `sustained_ms`: seconds a call runs back to back before it is timed (the H100's power controller settles within
# them), seconds it is timed for, and the longest synchronized batch while settling.
SETTLE_SECONDS = 0.5
WINDOW_SECONDS = 1.0
SETTLE_BATCH_SECONDS = 0.1
# `clean_l2_ms`: bytes read before each call, well past L2 (50 MB on the H100, 60 MB on the H200).
CLEAN_L2_BYTES = 256 << 20


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


def median_ms(call: Callable[[], object], rep_ms: int = 100) -> float:
    """do_bench's median milliseconds of the call over about `rep_ms` of repetitions, the L2 flushed before each
    (the GPU idles briefly there, so a clock held down by the power cap partly recovers before each call)."""
    from triton.testing import do_bench

    return do_bench(call, warmup=25, rep=rep_ms, return_mode="median")


def clean_l2_ms(call: Callable[[], object], rep_ms: int = 100) -> float:
    """Median milliseconds of the call with L2 full of clean lines before each: CLEAN_L2_BYTES read (summed) first.
    do_bench's flush writes instead, which leaves L2 full of dirty lines the call's first reads must write back
    (up to ~50 MB of extra traffic); a model's attention more likely follows weight reads (benchmarks/NOTES.md, "v58
    under other L2 states"). CUDA events around each call; about `rep_ms` of calls, at least ten.

    >>> import torch
    >>> if torch.cuda.is_available():
    ...     x = torch.randn(1024, 1024, device="cuda")
    ...     assert 0 < clean_l2_ms(lambda: x @ x, 5) < 100
    """
    lines = torch.empty(CLEAN_L2_BYTES // 4, dtype=torch.int32, device="cuda")
    total = torch.empty((), dtype=torch.int64, device="cuda")

    def timed_once() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        torch.sum(lines, dim=0, out=total)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        return start, end

    estimate = [timed_once() for _ in range(5)]
    torch.cuda.synchronize()
    per_call_ms = statistics.median(start.elapsed_time(end) for start, end in estimate)
    events = [timed_once() for _ in range(max(10, math.ceil(rep_ms / max(per_call_ms, 1e-3))))]
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def eager_us(call: Callable[[], object]) -> float:
    """`median_ms` in microseconds."""
    return median_ms(call) * 1e3


def sustained_ms(call: Callable[[], object], settle_s: float = SETTLE_SECONDS,
                 window_s: float = WINDOW_SECONDS) -> float:
    """Mean milliseconds of `call` run back to back without an L2 flush, after `settle_s` seconds of the same:
    the GPU's steady state in a run of such calls, where a clock held down by the power cap has settled
    (benchmarks/NOTES.md, "Prefill is power-bound"). CUDA events around about `window_s` seconds of calls (at
    least three); a call whose host time exceeds its GPU time is timed by the host.

    >>> import torch
    >>> if torch.cuda.is_available():
    ...     x = torch.randn(1024, 1024, device="cuda")
    ...     assert 0 < sustained_ms(lambda: x @ x, 0.05, 0.05) < 100
    """
    per_call_s = _settle(call, settle_s)
    count = max(3, math.ceil(window_s / per_call_s))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / count


def _settle(call: Callable[[], object], seconds: float) -> float:
    """`call` back to back for about `seconds`, in synchronized batches that double up to SETTLE_BATCH_SECONDS:
    the seconds per call of the last batch."""
    began = time.perf_counter()
    batch = 1
    while True:
        batch_began = time.perf_counter()
        for _ in range(batch):
            call()
        torch.cuda.synchronize()
        now = time.perf_counter()
        per_call = (now - batch_began) / batch
        if now - began >= seconds:
            return per_call
        if per_call * batch * 2 <= SETTLE_BATCH_SECONDS:
            batch *= 2
