"""Device experiment: one decode call's time after three kinds of L2 flush: writing 256 MB (what
`triton.testing.do_bench` does: L2 left full of dirty lines the call's reads must write back first),
reading 256 MB (L2 full of clean lines), and none (the call's own data may still be cached), all three by one
loop (synchronized single replays) so that they compare; `mlakit bench decode --clean-l2` is the benchmark's form of
the second (`mlakit.bench.timing.clean_l2_ms`).

Usage: python benchmarks/experiments/flush_kinds.py [--flashmla] [MODULE.NAME=VALUE] HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
(an optional argument sets a setting of `mlakit.kernels.MODULE` first, e.g. l2_evict_first.EVICT_FIRST_MAX_ROW_TILES=0;
VALUE a Python literal; with --flashmla, FlashMLA's call on the same inputs too: built and on PYTHONPATH).
"""

import statistics
import sys

import torch
from decode_case import case_inputs, decode_call, parse_assignment, set_setting

from mlakit.bench.decode import DecodeCase

REPS = 100
buffer = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
flushes = {"dirty": buffer.zero_, "clean": lambda: buffer.sum(), "none": lambda: None}


def median_us(graph: torch.cuda.CUDAGraph, flush) -> float:
    times = []
    for _ in range(REPS):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


specs = sys.argv[1:]
with_flashmla = "--flashmla" in specs
specs = [spec for spec in specs if spec != "--flashmla"]
if specs and "=" in specs[0]:
    set_setting(*parse_assignment(specs.pop(0)))
tiny = torch.zeros(1, device="cuda")
tiny_graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(tiny_graph):
    tiny.add_(1)
for spec in specs:
    case = DecodeCase.parse(spec)
    inputs, plan = case_inputs(case)
    calls = {"mlakit": decode_call(inputs, plan)}
    if with_flashmla:
        from mlakit.bench.peers import _flashmla_call
        calls["flashmla"] = _flashmla_call(inputs)
    for library, call in calls.items():
        call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        print(f"{case.label} {library}: " + ", ".join(
            f"{name} flush {median_us(graph, f):.1f} us (tiny kernel {median_us(tiny_graph, f):.1f})"
            for name, f in flushes.items()), flush=True)
