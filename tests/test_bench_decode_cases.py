"""`bench decode --case` specs: parsed into validated `DecodeCase`s before any device work, so a bad spec is refused
with its field named (also on a machine without a GPU) instead of failing mid-run."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from mlakit.bench.cli import bench
from mlakit.bench.decode import DecodeCase


@pytest.mark.parametrize("spec, expected", [
    ("128,64,ragged,2,fp8_e4m3,64", DecodeCase(128, 64, None, 2, "fp8_e4m3", 64)),
    (" 16, 16, 4096, 1, bf16, 16 ", DecodeCase(16, 16, 4096, 1, "bf16", 16)),
    ("16,16,4096,2", DecodeCase(16, 16, 4096, 2, "bf16", 64)),
    ("16,16,4096,1,fp8_e4m3", DecodeCase(16, 16, 4096, 1, "fp8_e4m3", 64)),
    ("128,40,~8192,2", DecodeCase(128, 40, 8192, 2, "bf16", 64, uneven=True)),
])
def test_a_spec_gives_its_case(spec, expected):
    assert DecodeCase.parse(spec) == expected


SHAPE = "expected heads,batch,seqlen|~seqlen|ragged,q_len[,kv_dtype[,page_size]]"


@pytest.mark.parametrize("spec, message", [
    ("128,64,4096,1,fp8,64", "kv_dtype: expected one of bf16, fp16, fp8_e4m3, fp32, got 'fp8'"),
    ("128,64,4096", SHAPE),
    ("128,64,4096,1,bf16,64,7", SHAPE),
    ("128,ragged,4096,1,bf16,64", SHAPE),
    ("128,64,4096,1.5,bf16,64", SHAPE),
    ("128,0,4096,1,bf16,64", "batch: expected a positive integer, got 0"),
    ("128,4,0,1,bf16,64", "seqlen: expected a positive integer, got 0"),
    ("128,4,~ragged,1", "uneven: expected a seqlen to draw lengths around, got the ragged batch"),
    ("128,4,~,1", SHAPE),
    ("128,4,~~4096,1", SHAPE),
])
def test_a_bad_spec_is_refused_naming_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DecodeCase.parse(spec)


def test_the_cli_refuses_a_bad_case_before_any_device_work():
    result = CliRunner().invoke(bench, ["decode", "--case", "128,64,4096,1,bf16,64", "--case", "128,64,4096,1,fp8,64"])
    assert result.exit_code == 2, result.output
    assert "--case" in result.output and "got 'fp8'" in result.output


def test_an_uneven_batch_draws_seeded_lengths_within_a_fifth_of_its_seqlen_and_is_labelled_so():
    case = DecodeCase.parse("128,40,~8192,2")
    lengths = case.lengths()
    assert lengths == case.lengths() and len(lengths) == 40 and len(set(lengths)) > 30
    assert all(0.8 * 8192 <= n <= 1.2 * 8192 for n in lengths)
    assert min(lengths) < 0.85 * 8192 and max(lengths) > 1.15 * 8192, "the whole spread is drawn from"
    # The seed of the experiments' former UnevenCase (session 24's uneven batches, NOTES.md v84b), kept.
    assert DecodeCase.parse("16,80,~16384,2").lengths()[:3] == [17585, 19168, 16595]
    assert max(lengths) <= 1.25 * sum(lengths) / len(lengths), "not ragged for the split plan"
    assert case.label == "h128 40x~8192 q2 bf16 p64" and DecodeCase.parse("128,40,8192,2").lengths() == [8192] * 40


def test_a_run_where_no_kernel_ran_a_case_fails_naming_that(monkeypatch, tmp_path):
    """Every case failed (e.g. a Triton that cannot find its ptxas): exit 1 with the reason, no empty JSON or plot."""
    import mlakit.bench.cli as bench_cli
    from mlakit.bench.ceilings import Ceilings
    from mlakit.device import DeviceInfo

    monkeypatch.setattr(bench_cli, "_require_cuda", lambda command: None)
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, device="auto": DeviceInfo.from_arch("sm90")))
    monkeypatch.setattr(bench_cli, "measure_ceilings", lambda device, sustained: Ceilings(3000.0, 700.0))
    monkeypatch.setattr(bench_cli, "run_cases", lambda *args: [])
    json_path = tmp_path / "decode.json"
    result = CliRunner().invoke(bench, ["decode", "--case", "16,2,256,1", "--backends", "triton", "--no-baseline",
                                        "--json", str(json_path), "--plot", str(tmp_path / "decode.png")])
    assert result.exit_code == 1, result.output
    assert "no kernel ran a case" in result.output
    assert not json_path.exists()
