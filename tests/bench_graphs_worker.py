"""`mlakit bench decode --graphs` without CUDA: a stand-in for `DecodeGraphs` and a timer that runs
the step once, for tests/test_bench_graphs.py, and the rank processes of its gloo run on CPU
(two ranks, TP2 x DCP2, reference backend, tiny shapes: the eager path and its collectives).
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from mlakit.bench import graphs as graphs_bench
from mlakit.bench.ceilings import Ceilings
from mlakit.bench.graphs import GraphBenchSettings, StepTime
from mlakit.distributed import init_parallel
from mlakit.serving.graphs import DecodeBuffers, check_step_values

RANK_SETTINGS = GraphBenchSettings(layers=2, heads=4, batches=(1, 3), context=37, q_len=2, backend="reference",
                                   page_size=8, warmup=0, steps=3, tp_size=2, dcp_size=2, dcp_interleave=4)


class Replay:
    """Stands in for a captured graph: reruns the step into the same output tensor."""

    def __init__(self, run, out: torch.Tensor):
        self.run, self.out = run, out

    def replay(self) -> None:
        self.out.copy_(self.run())


class EagerGraphs:
    """DecodeGraphs' interface without CUDA: `capture` runs each bucket once, `run` checks the values
    as asked, fills the real buffers and "replays" (reruns the step, output masked as the real graphs do)."""

    made: list[EagerGraphs] = []

    def __init__(self, step, *, backend, max_batch, q_len, heads, dim, max_pages, page_size, num_pages, dtype, device,
                 buckets):
        self.step, self.backend, self.heads = step, backend, heads
        self.page_size, self.num_pages = page_size, num_pages
        self.buckets = tuple(sorted({b for b in buckets if b <= max_batch} | {max_batch}))
        self.buffers = DecodeBuffers.allocate(max_batch, q_len, heads, dim, max_pages, dtype, device)
        self._graphs: dict[int, tuple[Replay, torch.Tensor]] = {}
        EagerGraphs.made.append(self)

    def bucket_for(self, batch: int) -> int:
        return min(b for b in self.buckets if b >= batch)

    def capture(self, warm_inputs=None) -> None:
        q, table, lens = warm_inputs
        for bucket in self.buckets:
            view = self.buffers.view(bucket)

            def masked(view=view):
                out = self.step(view)
                return torch.where(view.real_rows.view(-1, 1, 1, 1), out, torch.zeros((), dtype=out.dtype))

            self.buffers.fill(q[:bucket], table[:bucket], lens[:bucket], None, bucket)
            out = masked()
            self._graphs[bucket] = (Replay(masked, out), out)

    def run(self, q, block_table, cache_seqlens, *, check_values=True):
        if check_values:
            check_step_values(block_table, cache_seqlens, None, page_size=self.page_size, num_pages=self.num_pages)
        bucket = self.bucket_for(q.shape[0])
        self.buffers.fill(q, block_table, cache_seqlens, None, bucket)
        return self.replay(q.shape[0])[: q.shape[0]]

    def replay(self, batch):
        replay, out = self._graphs[self.bucket_for(batch)]
        replay.replay()
        return out


def run_once_timer(timed: list[int]):
    """A `time_step` that runs the step once (so every rank runs its collectives equally often) and
    returns 1, 2, 3, ... ms in call order, recording each call's `steps` in `timed`."""

    def fake_time(fn, warmup, steps):
        fn()
        timed.append(steps)
        return StepTime(float(len(timed)), float(len(timed)), steps)

    return fake_time


def fake_device_side() -> None:
    """Replaces everything of the bench that needs CUDA (graphs, timer, ceilings, environment)."""
    graphs_bench.DecodeGraphs = EagerGraphs
    graphs_bench.time_step = run_once_timer([])
    graphs_bench.measure_ceilings = lambda device: Ceilings(100.0, 10.0)
    graphs_bench.environment = lambda device, ceilings: {"device": "cpu", "ceilings": {"copy_gb_per_s": 100.0}}


def run_bench_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank of `RANK_SETTINGS` through `run_and_report` over gloo; writes what it logged, its
    results and the graphs' shapes to `rank{r}.json` (the bench's own JSON goes to `bench.json`)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    fake_device_side()
    parallel = init_parallel(RANK_SETTINGS.serving_config())
    lines: list[str] = []
    results = graphs_bench.run_and_report(RANK_SETTINGS, torch.device("cpu"), Path(out_dir, "bench.json"),
                                          lines.append, parallel)
    report = {
        "lines": lines,
        "results": [r.to_json() for r in results],
        "graph_heads": [g.heads for g in EagerGraphs.made],
        "dcp_rank": parallel.dcp_rank,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
