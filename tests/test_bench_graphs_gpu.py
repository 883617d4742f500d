"""`mlakit bench decode --graphs` on a CUDA device at NCCL world size 1 (run on the device machine;
skipped without CUDA): the DCP stack's metadata, collectives and kernels captured in one graph per
bucket and replayed with new lengths, and the whole benchmark with a rank's groups."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from mlakit import ServingConfig
from mlakit.bench import graphs as graphs_bench
from mlakit.bench.graphs import (
    GraphBenchSettings,
    attention_stack,
    capture_stack,
    dcp_attention_stack,
    exchange_stack,
    make_stack_inputs,
    relative_error,
)
from mlakit.distributed import init_parallel

pytestmark = pytest.mark.gpu

SETTINGS = GraphBenchSettings(layers=3, heads=16, batches=(1, 3, 8), context=300, q_len=2, page_size=64, warmup=2, steps=5)


@pytest.fixture
def nccl_world_of_one():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda:0"))
    yield
    dist.destroy_process_group()


def test_dcp_stack_with_its_collectives_replays_new_lengths_as_eager(nccl_world_of_one) -> None:
    device = torch.device("cuda")
    inputs = make_stack_inputs(SETTINGS, device)
    step = dcp_attention_stack(inputs.caches, SETTINGS, dist.group.WORLD)
    graphs = capture_stack(step, SETTINGS, device, inputs)
    exchange = capture_stack(exchange_stack(SETTINGS, dist.group.WORLD), SETTINGS, device, inputs)
    for batch in (1, 2, 3, 8):  # 2 replays bucket 3 with a padded row
        q, table, lengths = inputs.rows(batch)
        for shorter in (0, 7):  # the capture's lengths, then new ones
            new_lengths = lengths - shorter
            got = graphs.run(q, table, new_lengths).clone()
            torch.testing.assert_close(got, step(q, table, new_lengths), atol=1e-3, rtol=0)
            assert relative_error(got, attention_stack(inputs.caches, SETTINGS)(q, table, new_lengths)) < 1e-2
        assert torch.equal(exchange.run(q, table, lengths), q)  # a group of one gathers its own heads


def test_whole_benchmark_with_a_ranks_groups(nccl_world_of_one, tmp_path) -> None:
    parallel = init_parallel(ServingConfig())
    path = tmp_path / "graphs.json"
    results = graphs_bench.run_and_report(SETTINGS, torch.device("cuda"), path, print, parallel)
    assert [r.batch for r in results] == [1, 3, 8] and all(r.ok for r in results)
    assert all(r.comm is None for r in results)  # DCP size 1: plain mla_decode, no collectives in the step
    data = json.loads(path.read_text())
    assert data["environment"]["world_size"] == 1 and data["environment"]["process_group"] == "nccl"
