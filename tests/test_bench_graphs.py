"""The pure parts of `mlakit bench decode --graphs` (settings, results, JSON shape, summary line, option
wiring, the CPU refusal) and its whole flow on CPU with the reference backend, graphs and timer faked."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner

from bench_graphs_worker import RANK_SETTINGS, EagerGraphs, run_bench_rank, run_once_timer
from dcp_worker import run_world
from mlakit import ServingConfig
from mlakit.bench import graphs as graphs_bench
from mlakit.bench.ceilings import Ceilings
from mlakit.bench.cli import bench
from mlakit.cli import main
from mlakit.bench.graphs import GraphBatchResult, GraphBenchSettings, StepTime, block_table, format_table, results_json, summary_line
from mlakit.distributed import ParallelGroups, TokenSharding, join_ranks
from mlakit.errors import ConfigError

cpu_machine_only = pytest.mark.skipif(torch.cuda.is_available(), reason="describes a CPU-only machine")


def _result(batch: int = 16, eager: float = 9.0, graph: float = 6.0, replay: float = 5.9, error: float = 0.0) -> GraphBatchResult:
    return GraphBatchResult(batch, 61, batch * 4096, 61 * batch * 4096 * 576 * 2, error,
                            StepTime(eager, eager + 0.1, 100), StepTime(graph, graph, 100), StepTime(replay, replay, 100))


def test_default_settings_are_the_deepseek_v3_stack():
    s = GraphBenchSettings()
    assert (s.layers, s.heads, s.batches, s.context, s.q_len, s.backend) == (61, 128, (1, 16, 64), 4096, 1, "triton")
    assert (s.page_size, s.kv_lora_rank, s.rope_dim, s.dim) == (64, 512, 64, 576)
    assert s.softmax_scale == pytest.approx(192**-0.5 * (0.1 * torch.log(torch.tensor(40.0)).item() + 1) ** 2)
    assert 17e9 < s.cache_bytes() < 20e9  # 61 x 64 x ~4096 tokens x 576 x 2 B: fits an 80 GB H100


def test_lengths_are_random_around_the_context_and_reproducible():
    s = GraphBenchSettings()
    lengths = s.lengths()
    assert len(lengths) == 64 and lengths == GraphBenchSettings().lengths()
    assert min(lengths) >= 3072 and max(lengths) <= 5120 and len(set(lengths)) > 32
    assert 3800 < sum(lengths) / 64 < 4400
    assert lengths != GraphBenchSettings(seed=1).lengths()
    assert s.max_pages() == max(-(-n // 64) for n in lengths) <= 80
    assert s.pages_per_layer() == sum(-(-n // 64) for n in lengths) + 1
    # Short contexts never go below the query tokens; no spread gives the context exactly.
    assert min(GraphBenchSettings(context=4, q_len=4, spread=0.5).lengths()) == 4
    assert set(GraphBenchSettings(context=100, spread=0.0).lengths()) == {100}


def test_tp8_and_speculative_verify_settings():
    s = GraphBenchSettings(heads=16, q_len=4)
    assert s.heads == 16 and s.q_len == 4 and s.softmax_scale == GraphBenchSettings().softmax_scale
    assert s.cache_bytes() == GraphBenchSettings().cache_bytes()  # the cache does not depend on heads


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"layers": 0}, "layers"),
        ({"heads": 0}, "heads"),
        ({"batches": ()}, "batches"),
        ({"batches": (1, 1)}, "batches"),
        ({"batches": (0, 4)}, "batches"),
        ({"spread": 1.0}, "spread"),
        ({"context": 2, "q_len": 4}, "at least q_len"),
        ({"steps": 0}, "steps"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GraphBenchSettings(**kwargs)


def test_block_table_gives_every_sequence_its_own_pages():
    lengths = [130, 64, 1, 4096]
    table = block_table(lengths, page_size=64, seed=0)
    counts = [3, 1, 1, 64]
    assert table.dtype == torch.int32 and table.shape == (4, 64)
    used = [p for row, count in zip(table.tolist(), counts) for p in row[:count]]
    assert sorted(used) == list(range(sum(counts)))
    assert torch.equal(table, block_table(lengths, page_size=64, seed=0))


def test_result_numbers_and_summary_line():
    r = _result(batch=16, eager=9.0, graph=6.0, replay=5.9)
    assert r.saved_ms == pytest.approx(3.0) and r.speedup == pytest.approx(1.5)
    assert r.eager_us_per_layer == pytest.approx(9000 / 61) and r.graph_us_per_layer == pytest.approx(6000 / 61)
    assert r.replay_us_per_layer == pytest.approx(5900 / 61)
    assert r.host_overhead_ms == pytest.approx(3.1) and r.graph_overhead_ms == pytest.approx(0.1)
    assert r.kv_gb_per_s == pytest.approx(61 * 16 * 4096 * 1152 / 5.9 / 1e6)
    assert r.ok and not _result(error=0.02).ok
    assert summary_line(r) == (
        "batch 16: eager 9.00 ms/step, graph 6.00 ms/step (replay 5.90 ms GPU), saved 3.00 ms (1.50x); "
        "per layer 147.5 / 98.4 / 96.7 us"
    )


def test_table_has_a_row_per_batch_and_the_copy_share():
    lines = format_table([_result(1), _result(64)], copy_gb_per_s=3000.0)
    assert len(lines) == 3 and "eager ms" in lines[0] and "% copy" in lines[0]
    assert lines[1].split()[0] == "1" and lines[2].split()[0] == "64"
    share = 100 * _result(64).kv_gb_per_s / 3000.0
    assert f"{share:.1f}" in lines[2]
    assert format_table([_result(1)])[1].split()[-2] == "-"  # no ceiling: no share


def test_json_shape():
    settings = GraphBenchSettings(heads=16)
    data = json.loads(json.dumps(results_json(settings, {"device": "H100", "ceilings": {"copy_gb_per_s": 3000.0}},
                                              [_result(1), _result(16)])))
    assert set(data) == {"environment", "settings", "results"}
    assert data["environment"]["device"] == "H100"
    s = data["settings"]
    assert (s["layers"], s["heads"], s["batches"], s["context"], s["q_len"], s["backend"]) == (61, 16, [1, 16, 64], 4096, 1, "triton")
    assert s["shared_q"] is True and s["l2_flush"] is False and s["kv_dtype"] == "bf16" and s["cache_bytes"] > 0
    row = data["results"][1]
    assert row["batch"] == 16 and row["eager"] == {"median_ms": 9.0, "wall_ms": 9.1, "steps": 100}
    for key in ("graph", "replay", "saved_ms", "speedup", "eager_us_per_layer", "graph_us_per_layer", "replay_us_per_layer",
                "host_overhead_ms", "graph_overhead_ms", "kv_gb_per_s", "rel_error", "tokens", "kv_bytes", "ok"):
        assert key in row


@cpu_machine_only
def test_cli_graphs_needs_cuda():
    refusal = "error: mlakit bench decode: expected a CUDA device (it times GPU kernels), got none"
    for arguments in (["--graphs"], ["--graphs", "--graph-heads", "16", "--graph-q-len", "2", "--json", "x.json"]):
        result = CliRunner().invoke(main, ["bench", "decode", *arguments])
        assert result.exit_code == 2 and refusal in result.output, result.output


def test_cli_graphs_passes_the_settings_and_defaults_its_own_json_file(monkeypatch):
    seen = []

    def fake_run(settings, device, json_path, log, parallel):
        assert parallel is None  # one process: no groups
        seen.append((settings, device, json_path))
        return [_result(1)] if len(seen) == 1 else [_result(1), _result(16, error=0.02)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(graphs_bench, "run_and_report", fake_run)
    result = CliRunner().invoke(bench, ["decode", "--graphs", "--graph-heads", "16", "--graph-context", "8192", "--graph-q-len", "2",
                                        "--graph-batches", "1,16", "--graph-layers", "4", "--graph-steps", "7"])
    assert result.exit_code == 0, result.output
    settings, device, json_path = seen[0]
    assert settings == GraphBenchSettings(layers=4, heads=16, batches=(1, 16), context=8192, q_len=2, steps=7)
    assert device.type == "cuda" and str(json_path) == "decode_graphs_bench.json"
    result = CliRunner().invoke(bench, ["decode", "--graphs", "--graph-backend", "flashmla", "--json", "mine.json"])
    assert result.exit_code == 1 and "graph output differs from eager at batch [16]" in result.output
    assert seen[1][0].backend == "flashmla" and str(seen[1][2]) == "mine.json"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--graphs", "--quick"], "--graphs replaces the kernel grid; drop --quick"),
        (["--graphs", "--heads", "16"], "--graphs replaces the kernel grid; drop --heads"),
        (["--graphs", "--sustained"], "--graphs replaces the kernel grid; drop --sustained"),
        (["--graphs", "--clean-l2"], "--graphs replaces the kernel grid; drop --clean-l2"),
        (["--sustained", "--clean-l2"], "drop --clean-l2 or --sustained"),
        (["--graphs", "--case", "128,1,4096,1,bf16,64", "--no-baseline"], "drop --case, --no-baseline"),
        (["--graph-heads", "16"], "--graph-heads only apply with --graphs"),
        (["--graphs", "--graph-batches", "1,x"], "invalid literal"),
        (["--graphs", "--graph-batches", "1,1"], "distinct positive batch sizes"),
        (["--graphs", "--graph-context", "0"], "context"),
    ],
)
def test_cli_option_mistakes_are_usage_errors_before_any_device_work(args, message):
    result = CliRunner().invoke(bench, ["decode", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_whole_flow_on_cpu_with_the_reference_backend(monkeypatch, tmp_path):
    calls: list[tuple[int, int]] = []
    real_decode = graphs_bench.mla_decode

    def counting_decode(q, cache, table, lengths, **kwargs):
        assert kwargs["kv_lora_rank"] == 512 and kwargs["return_lse"] is False and kwargs["backend"] == "reference"
        calls.append((id(cache), q.shape[0]))
        return real_decode(q, cache, table, lengths, **kwargs)

    timed: list[int] = []
    EagerGraphs.made.clear()
    monkeypatch.setattr(graphs_bench, "mla_decode", counting_decode)
    monkeypatch.setattr(graphs_bench, "DecodeGraphs", EagerGraphs)
    monkeypatch.setattr(graphs_bench, "time_step", run_once_timer(timed))
    monkeypatch.setattr(graphs_bench, "measure_ceilings", lambda device: Ceilings(100.0, 10.0))
    monkeypatch.setattr(graphs_bench, "environment", lambda device, ceilings: {"device": "cpu", "ceilings": {"copy_gb_per_s": 100.0}})
    settings = GraphBenchSettings(layers=3, heads=2, batches=(1, 3), context=80, q_len=2, backend="reference", page_size=16,
                                  warmup=0, steps=5)
    lines: list[str] = []
    path = tmp_path / "graphs.json"
    results = graphs_bench.run_and_report(settings, torch.device("cpu"), path, lines.append)

    assert [r.batch for r in results] == [1, 3]
    assert all(r.rel_error == 0.0 and r.ok for r in results)  # the same kernels in both paths
    assert timed == [5] * 6  # eager, graph, replay per batch
    assert EagerGraphs.made[0].buckets == (1, 3) and EagerGraphs.made[0].backend == "reference"
    checked, steps = calls[0], calls[1:]  # one call with the value checks, then whole steps
    layers = [cache for cache, _ in steps[:3]]
    assert len(set(layers)) == 3 and checked[0] == layers[0]  # every layer reads its own cache
    assert len(steps) % 3 == 0 and all([cache for cache, _ in steps[i : i + 3]] == layers for i in range(0, len(steps), 3))
    assert {batch for _, batch in steps} == {1, 3}
    assert results[1].tokens == sum(settings.lengths()[:3])
    assert results[1].kv_bytes == 3 * results[1].tokens * 576 * 2
    assert any(line.startswith("batch 1: eager") and "rel err 0.0e+00 ok" in line for line in lines)
    assert any("eager ms" in line for line in lines) and lines[-1] == f"wrote {path}"
    data = json.loads(path.read_text())
    assert data["environment"]["device"] == "cpu" and data["settings"]["q_len"] == 2 and len(data["results"]) == 2
    assert data["environment"]["world_size"] == 1 and data["environment"]["process_group"] is None
    assert all(row["comm"] is None and row["comm_bytes"] == 0 for row in data["results"])  # no collectives in one process


def test_caches_beyond_the_memory_budget_are_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(graphs_bench, "DecodeGraphs", EagerGraphs)
    with pytest.raises(ConfigError, match=r"need 18\.6 GB, more than the 10\.0 GB budget"):
        graphs_bench.run_graph_bench(GraphBenchSettings(), torch.device("cpu"), print, memory_budget=10e9)


def test_a_backend_that_cannot_be_captured_is_refused_before_allocating():
    settings = GraphBenchSettings(layers=2, heads=2, batches=(1,), context=32, backend="intel_xpu")
    with pytest.raises(ConfigError, match="cannot be captured"):
        graphs_bench.run_graph_bench(settings, torch.device("cpu"), print)


def test_cli_grid_heads_keeps_only_those_head_counts(monkeypatch, tmp_path):
    from mlakit.bench import cli as bench_cli
    from mlakit.device import DeviceInfo

    timed = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, device="auto": DeviceInfo.from_arch("sm90")))
    monkeypatch.setattr(bench_cli, "measure_ceilings", lambda device, sustained: Ceilings(100.0, 10.0))
    monkeypatch.setattr(bench_cli, "run_cases",
                        lambda cases, kernels, device, ceilings, log, timing: timed.extend(cases) or [{"case": "timed"}])
    monkeypatch.setattr(bench_cli, "_echo_targets", lambda rows: None)
    monkeypatch.setattr(bench_cli, "write_results", lambda path, env, rows: None)
    monkeypatch.setattr(bench_cli, "plot_results", lambda path, rows: None)
    monkeypatch.setattr(bench_cli, "environment", lambda device, ceilings: {})
    result = CliRunner().invoke(bench, ["decode", "--heads", "64", "--heads", "16", "--no-baseline",
                                        "--json", str(tmp_path / "x.json"), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.output
    assert timed and {case.heads for case in timed} == {64, 16}
    full = [case for case in bench_cli.default_cases(False) if case.heads in (64, 16)]
    assert timed == full


@pytest.mark.parametrize("flag, timing", [([], "flushed"), (["--sustained"], "sustained"), (["--clean-l2"], "clean-l2")])
def test_cli_times_the_replays_flushed_sustained_or_with_a_clean_l2(monkeypatch, tmp_path, flag, timing):
    from mlakit.bench import cli as bench_cli
    from mlakit.device import DeviceInfo

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, device="auto": DeviceInfo.from_arch("sm90")))
    monkeypatch.setattr(bench_cli, "measure_ceilings",
                        lambda device, sustained: seen.update(ceilings=sustained) or Ceilings(100.0, 10.0))
    monkeypatch.setattr(bench_cli, "run_cases",
                        lambda cases, kernels, device, ceilings, log, timing: seen.update(timing=timing) or [{"case": "timed"}])
    monkeypatch.setattr(bench_cli, "_echo_targets", lambda rows: None)
    monkeypatch.setattr(bench_cli, "write_results", lambda path, env, rows: seen.update(env=env))
    monkeypatch.setattr(bench_cli, "plot_results", lambda path, rows: None)
    monkeypatch.setattr(bench_cli, "environment", lambda device, ceilings: {})
    result = CliRunner().invoke(bench, ["decode", "--case", "16,1,1024,1,bf16,64", "--no-baseline", *flag,
                                        "--json", str(tmp_path / "x.json"), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.output
    assert seen["timing"] == timing
    assert seen["ceilings"] == (timing == "sustained")
    assert seen["env"] == {"timing": timing}


def test_cli_grid_heads_that_match_no_case_are_a_usage_error(monkeypatch):
    from mlakit.bench import cli as bench_cli
    from mlakit.device import DeviceInfo

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, device="auto": DeviceInfo.from_arch("sm90")))
    monkeypatch.setattr(bench_cli, "measure_ceilings", lambda device: pytest.fail("no device work before the check"))
    result = CliRunner().invoke(bench, ["decode", "--heads", "7", "--no-baseline"])
    assert result.exit_code == 2 and "the grid has no case with 7 heads" in result.output


def test_tp_and_dcp_settings_split_heads_and_cache():
    one = GraphBenchSettings()
    s = GraphBenchSettings(tp_size=8, dcp_size=4, dcp_interleave=16)
    assert s.heads == 128 and s.heads_per_rank == 16 and one.heads_per_rank == 128
    assert [sum(s.local_lengths(r)) for r in range(4)] != [sum(one.lengths())] * 4
    assert [sum(n) for n in zip(*(s.local_lengths(r) for r in range(4)))] == one.lengths()  # every token on one rank
    assert any(n % 16 for n in s.lengths())  # lengths that are not multiples of the interleave
    assert s.local_lengths(0) >= s.local_lengths(3) and s.pages_per_layer() == sum(-(-n // 64) for n in s.local_lengths(0)) + 1
    assert s.cache_bytes() < one.cache_bytes() / 3.5
    assert GraphBenchSettings(tp_size=8).cache_bytes() == one.cache_bytes()  # TP alone: every rank caches every token
    # README: DeepSeek-V3 at TP8 x DCP8, 64 sequences decoding one token, 15.6 MB per layer.
    assert GraphBenchSettings(tp_size=8, dcp_size=8, layers=1).exchange_bytes(64) == 7 * 64 * 16 * (1152 + 1024 + 4)
    assert GraphBenchSettings(tp_size=8).exchange_bytes(64) == 0
    data = s.to_json()
    assert (data["tp_size"], data["dcp_size"], data["dcp_interleave"]) == (8, 4, 16)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tp_size": 3}, "heads: expected a multiple of tp_size=3"),
        ({"tp_size": 2, "dcp_size": 4}, "dcp_size=4 does not divide tp_size=2"),
        ({"tp_size": 0}, "tp_size"),
        ({"dcp_interleave": 0}, "dcp_interleave"),
    ],
)
def test_bad_rank_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GraphBenchSettings(**kwargs)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp-size", "2"], "--tp-size only apply with --graphs"),
        (["--graphs", "--tp-size", "3"], "heads: expected a multiple of tp_size=3"),
        (["--graphs", "--tp-size", "2", "--dcp-size", "4"], "dcp_size=4 does not divide tp_size=2"),
    ],
)
def test_cli_rank_option_mistakes_are_usage_errors(args, message):
    result = CliRunner().invoke(bench, ["decode", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def _refusal(monkeypatch, args: list[str]) -> str:
    """The CLI's one-line error for `args` with a CUDA device pretended; nothing is benchmarked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(graphs_bench, "run_and_report", lambda *a: pytest.fail("refused before running"))
    result = CliRunner().invoke(main, ["bench", "decode", "--graphs", *args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    return result.output


def test_cli_tp_size_without_torchrun_is_one_line(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    output = _refusal(monkeypatch, ["--tp-size", "2", "--dcp-size", "2"])
    assert "start them with torchrun --nproc-per-node 2 -m mlakit.bench decode --graphs --tp-size 2" in output


def test_cli_world_size_other_than_tp_size_is_one_line(monkeypatch):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # as torchrun with one process
    output = _refusal(monkeypatch, ["--tp-size", "2"])
    assert "world size 1 does not equal tp_size=2" in output
    assert not dist.is_initialized()  # the CLI leaves the group it joined


def test_cli_dcp_with_a_backend_without_lse_is_one_line_before_joining(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    output = _refusal(monkeypatch, ["--tp-size", "2", "--dcp-size", "2", "--graph-backend", "trtllm_mla"])
    assert "backend 'trtllm_mla' does not return the log-sum-exp" in output and "--dcp-size 1" in output


def test_join_ranks_turns_multicast_off_where_unset(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "NVSHMEM_DISABLE_NVLS": "kept"}.items():
        monkeypatch.setenv(name, value)
    for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        with pytest.raises(ConfigError, match="world size 1 does not equal tp_size=2"):
            join_ranks(ServingConfig(tp_size=2))
        assert dist.get_backend() == "gloo"  # no GPU per rank
    finally:
        dist.destroy_process_group()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert os.environ["NVSHMEM_DISABLE_NVLS"] == "kept"


def test_two_gloo_ranks_run_the_dcp_stack_eagerly_and_rank_0_reports(tmp_path):
    """TP2 x DCP2 on CPU (reference backend, graphs and timer faked): per layer the DCP attention's
    collectives, per batch a comm-only step; rank 0 logs and writes the JSON, rank 1 stays quiet."""
    reports = run_world(2, tmp_path, target=run_bench_rank)
    assert [r["dcp_rank"] for r in reports] == [0, 1]
    assert reports[1]["lines"] == [] and reports[0]["lines"][-1] == f"wrote {tmp_path / 'bench.json'}"
    assert any("TP2 x DCP2" in line for line in reports[0]["lines"])
    assert sum("collectives" in line and "rel err 0.0e+00 ok" in line for line in reports[0]["lines"]) == 2
    for report in reports:
        assert report["graph_heads"] == [2, 2]  # the attention stack's graphs and the comm-only step's: heads / tp
        for row, batch in zip(report["results"], (1, 3)):
            assert row["batch"] == batch and row["rel_error"] == 0.0 and row["ok"]
            assert row["comm"]["steps"] == 3 and row["comm_bytes"] == RANK_SETTINGS.exchange_bytes(batch) > 0
            assert row["tokens"] == sum(RANK_SETTINGS.lengths()[:batch])
    kv = [[row["kv_bytes"] for row in r["results"]] for r in reports]
    assert kv[0] != kv[1] and sum(kv[0]) + sum(kv[1]) > 0  # each rank reads its own shard
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["environment"]["world_size"] == 2 and data["environment"]["process_group"] == "gloo"
    s = data["settings"]
    assert (s["tp_size"], s["dcp_size"], s["dcp_interleave"], s["heads"]) == (2, 2, 4, 4)
    assert data["results"] == reports[0]["results"]


def test_dcp_over_gloo_on_a_gpu_is_refused_before_allocating():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ranks = ParallelGroups(rank=0, tp_size=2, dcp_size=2, sharding=TokenSharding(2), tp_group=dist.group.WORLD,
                               dcp_group=dist.group.WORLD)
        settings = GraphBenchSettings(layers=2, batches=(1,), tp_size=2, dcp_size=2)
        with pytest.raises(ConfigError, match="over NCCL only, and this group runs gloo"):
            graphs_bench.run_graph_bench(settings, torch.device("cuda"), print, parallel=ranks)
    finally:
        dist.destroy_process_group()
