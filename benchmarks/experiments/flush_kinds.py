"""Device experiment: one decode call's time after three kinds of L2 flush: writing 256 MB (what
`triton.testing.do_bench` does: L2 left full of dirty lines the call's reads must write back first),
reading 256 MB (L2 full of clean lines), and none (the call's own data may still be cached).

Usage: python benchmarks/experiments/flush_kinds.py HEADS,BATCH,SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import statistics
import sys

import torch
from decode_case import case_inputs, decode_call, parse_case

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


for spec in sys.argv[1:]:
    case = parse_case(spec)
    call = decode_call(*case_inputs(case))
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    tiny = torch.zeros(1, device="cuda")
    tiny_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(tiny_graph):
        tiny.add_(1)
    print(f"{case.label}: " + ", ".join(f"{name} flush {median_us(graph, f):.1f} us (tiny kernel {median_us(tiny_graph, f):.1f})"
                                        for name, f in flushes.items()))
