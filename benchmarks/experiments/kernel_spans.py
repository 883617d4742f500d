"""Device experiment: when each kernel of a decode call starts and ends on the GPU, relative to the call's first
kernel (torch.profiler's device timestamps, the L2 flushed before each call, medians over the calls), under several
values of one module setting and, with `--flashmla`, FlashMLA's call on the same inputs. Tells how long a call runs
past its main kernel's end (the combine's tail, which a programmatic launch can shorten by starting early).

Usage: python benchmarks/experiments/kernel_spans.py MODULE.NAME LABEL=VALUE [LABEL=VALUE ...] [+MODULE.NAME=VALUE ...]
    -- [--flashmla] CASE ...
    e.g. kernel_spans.py hopper_decode.dispatch.MERGE_MAX_SPLITS m4=4 m1=1 -- --flashmla 128,40,4096,2
(a `+` argument holds another setting at its value for every variant).
"""

import statistics
import sys
from collections.abc import Callable

import torch
from decode_case import case_plan, decode_call, set_setting, setting_variants
from torch.profiler import ProfilerActivity, profile

from mlakit.bench.decode import DecodeCase, make_inputs
from mlakit.bench.peers import _flashmla_call

CALLS = 20
FLUSH_BYTES = 256 << 20


def spans(call: Callable[[], object]) -> list[tuple[str, float, float]]:
    """(kernel, start, end) in microseconds from the call's first kernel's start, medians over CALLS flushed calls."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    kernels = sorted((event.time_range.start, event.time_range.end, event.name) for event in prof.events()
                     if event.device_type == torch.autograd.DeviceType.CUDA)
    calls: list[list[tuple[str, float, float]]] = []
    for start, end, name in kernels:
        if "FillFunctor" in name:
            calls.append([])
        elif calls:
            if not calls[-1]:
                t0 = start
            calls[-1].append((name[:40], start - t0, end - t0))
    shape = [name for name, _, _ in calls[0]]
    same = [c for c in calls if [name for name, _, _ in c] == shape]
    return [(name, statistics.median(c[i][1] for c in same), statistics.median(c[i][2] for c in same))
            for i, name in enumerate(shape)]


def report(label: str, spec: str, call: Callable[[], object]) -> None:
    parts = spans(call)
    main_end = parts[0][2]
    tail = parts[-1][2] - main_end
    text = "; ".join(f"{name} {start:.1f}-{end:.1f}" for name, start, end in parts)
    print(f"{spec:<22} {label:<9} end {parts[-1][2]:7.1f} us, past the first kernel {tail:5.1f} us: {text}", flush=True)


setting, variants, rest = setting_variants(sys.argv[1:])
with_flashmla = "--flashmla" in rest
for spec in [argument for argument in rest if not argument.startswith("--")]:
    case = DecodeCase.parse(spec)
    inputs = make_inputs(case, torch.device("cuda"))
    for label, value in variants.items():
        set_setting(setting, value)
        report(label, spec, decode_call(inputs, case_plan(case, inputs)))
    if with_flashmla:
        report("flashmla", spec, _flashmla_call(inputs))
