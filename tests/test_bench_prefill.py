"""The pure parts of `mlakit bench prefill`: case grid, FLOP count, memory skips, argument parsing, the CPU refusal."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from mlakit.bench.cli import bench
from mlakit.cli import main
from mlakit.bench.prefill import CHUNKED_TARGET, TARGET, Footprint, PrefillCase, PrefillResult, default_cases, full_plans, summary

cpu_machine_only = pytest.mark.skipif(torch.cuda.is_available(), reason="describes a CPU-only machine")


def test_quick_subset_holds_the_targets_and_16_head_spot_checks():
    quick, grid = default_cases(quick=True), default_cases(quick=False)
    assert TARGET == PrefillCase(heads=128, batch=1, new_tokens=8192, prefix=0)
    assert CHUNKED_TARGET == PrefillCase(heads=128, batch=1, new_tokens=2048, prefix=32768)
    assert TARGET in quick and CHUNKED_TARGET in quick
    assert any(c.heads == 16 for c in quick)
    assert set(quick) <= set(grid)
    assert len(grid) == len(set(grid)) == 2 * 2 * 3 * 3
    assert {c.heads for c in grid} == {128, 16} and {c.prefix for c in grid} == {0, 4096, 32768}


def test_attention_flops_by_hand():
    # 2 new tokens after 1 cached one: query 0 sees 2 keys, query 1 sees 3; 2 * (192 + 128) FLOPs per (query, key, head).
    assert PrefillCase(heads=1, batch=1, new_tokens=2, prefix=1).attention_flops == 2 * 320 * 5
    assert PrefillCase(heads=3, batch=2, new_tokens=2, prefix=1).attention_flops == 2 * 3 * 2 * 320 * 5
    # No prefix: the plain causal triangle, n (n + 1) / 2 pairs.
    assert PrefillCase(heads=1, batch=1, new_tokens=4, prefix=0).attention_flops == 2 * 320 * 10


def test_attention_flops_count_the_bottom_right_mask():
    n, p = 5, 7
    visible = torch.arange(p + n)[None, :] <= torch.arange(n)[:, None] + p
    assert PrefillCase(heads=1, batch=1, new_tokens=n, prefix=p).attention_flops == 2 * 320 * int(visible.sum())


def test_memory_skips():
    big = Footprint.of(PrefillCase(128, 8, 8192, 32768))
    assert big.fits(80e9) and big.baselines_fit(80e9)  # the largest grid case fits an 80 GB H100
    assert big.fits(50e9) and not big.baselines_fit(50e9)  # our kernel still runs, SDPA's copies do not fit
    assert not big.fits(30e9)
    assert 30e9 < big.peak < 50e9 < big.with_baselines < 80e9
    small = Footprint.of(PrefillCase(16, 1, 512, 0))
    assert small.fits(1e9) and small.baselines_fit(1e9)


def test_parse_case_and_plans():
    assert PrefillCase.parse("128,1,8192,0") == TARGET
    with pytest.raises(ValueError, match="heads,batch,new_tokens,prefix"):
        PrefillCase.parse("128,1,8192")
    assert full_plans(CHUNKED_TARGET)["one_piece"] == 32768
    assert full_plans(TARGET)["one_piece"] == 1


def test_summary_reports_the_chunked_ratio():
    rows = [
        PrefillResult(TARGET, "attention", "triton", 10.0, 10**12, 0.4, 1e-3),
        PrefillResult(CHUNKED_TARGET, "full", "chunk_4096", 12.0, 10**12, 0.3, 1e-3, x_one_piece=1.2),
    ]
    assert summary(rows) == [
        "target h128 b1 n8192 p0: triton at 40% of the matmul ceiling",
        "chunked h128 b1 n2048 p32768: chunk_4096 1.20x one-piece (target <= 1.1x)",
    ]
    assert rows[0].tflop_per_s == pytest.approx(100.0)
    assert rows[1].to_json()["heads"] == 128


@cpu_machine_only
def test_cli_needs_cuda():
    result = CliRunner().invoke(main, ["bench", "prefill", "--quick"])
    assert result.exit_code == 2
    assert "error: mlakit bench prefill: expected a CUDA device (it times GPU kernels), got none" in result.output


@pytest.mark.parametrize("flag, timing", [([], "flushed"), (["--sustained"], "sustained"), (["--sustained", "--fp8"], "sustained")])
def test_cli_times_sustained_or_flushed_and_adds_fp8_on_request(monkeypatch, tmp_path, flag, timing):
    from mlakit.bench import cli as bench_cli
    from mlakit.bench import timing as timers
    from mlakit.bench.ceilings import Ceilings

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"total_memory": 2**30}))
    monkeypatch.setattr(bench_cli, "measure_ceilings",
                        lambda device, sustained: seen.update(ceilings=sustained) or Ceilings(100.0, 10.0))
    monkeypatch.setattr(bench_cli.prefill_bench, "run_cases",
                        lambda cases, variants, device, ceilings, budget, log, time_ms, fp8: seen.update(
                            calls=time_ms, fp8=fp8) or bench_cli.prefill_bench.Run(ceilings, log, time_ms))
    monkeypatch.setattr(bench_cli.prefill_bench, "write_results", lambda path, env, run, budget: seen.update(env=env))
    monkeypatch.setattr(bench_cli.prefill_bench, "plot_results", lambda path, results: None)
    monkeypatch.setattr(bench_cli, "environment", lambda device, ceilings: {})
    result = CliRunner().invoke(bench, ["prefill", "--case", "2,1,64,0", *flag, "--json", str(tmp_path / "x.json"),
                                        "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.output
    expected = timers.sustained_ms if timing == "sustained" else timers.median_ms
    assert seen["ceilings"] == (timing == "sustained") and seen["calls"] is expected
    assert seen["env"] == {"timing": timing}
    assert f"({timing} timing)" in result.output
    assert seen["fp8"] == ("--fp8" in flag)
