"""The decode issues' targets read off benchmark rows (`mlakit bench decode-targets`), on made-up rows: issue 3's
against the anchors, issue 23's against FlashMLA rows of the same run."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from mlakit.bench.cli import bench
from mlakit.bench.decode import DecodeCase
from mlakit.bench.decode_targets import (FP8_128_HEAD_TOKENS, LARGE_CASE_TOKENS, anchor_simple_triton_times,
                                         check_round3_targets, check_targets, result_rows)


def _row(heads, batch, seqlen, q_len=1, kv_dtype="bf16", page_size=64, kernel="triton", time_us=100.0, x_floor=1.1,
         x_flashmla=None):
    case = DecodeCase(heads, batch, seqlen, q_len, kv_dtype, page_size)
    row = {"case": case.label, "kernel": kernel, "heads": heads, "batch": batch, "seqlen": seqlen, "q_len": q_len,
           "kv_dtype": kv_dtype, "page_size": page_size, "time_us": time_us, "x_floor": x_floor}
    if x_flashmla is not None:
        row["x_flashmla_anchor"] = x_flashmla
    return row


def _by_target(checks):
    return {c.target.split(":")[0]: c for c in checks}


GOOD_GRID = [
    _row(16, 16, 1024, x_flashmla=1.04), _row(16, 16, 1024, q_len=2, x_flashmla=0.9),
    _row(128, 1, 1024, time_us=6.0, x_flashmla=0.95),
    _row(128, 64, 4096, time_us=100.0, x_flashmla=1.2), _row(128, 16, 1024, time_us=30.0, x_flashmla=1.35),
    _row(128, 64, None, time_us=300.0, x_floor=1.25, x_flashmla=1.0),
    _row(16, 16, 1024, kv_dtype="fp8_e4m3", time_us=60.0),  # our bf16 16x1024 q1: 100 us -> 1.67x faster
    _row(16, 16, 1024, q_len=2, kv_dtype="fp8_e4m3", time_us=62.0),
    _row(128, 64, 4096, kv_dtype="fp8_e4m3", time_us=99.0),
    _row(128, 64, 4096, page_size=1, time_us=500.0, x_flashmla=0.5),
    _row(128, 64, 4096, kernel="simple", time_us=900.0),
]
SIMPLE = {(128, 1, 1024): 30.0, (128, 64, 4096): 510.0, (128, 16, 1024): 151.0, (128, 64, None): 2000.0}


def test_a_grid_meeting_every_target_is_reported_met_with_its_worst_case():
    checks = check_targets(GOOD_GRID, SIMPLE)
    assert all(c.met for c in checks), [c.line() for c in checks if not c.met]
    by_target = _by_target(checks)
    sixteen = by_target["16 heads (q1, q2) and batch 1"]
    assert (sixteen.cases, sixteen.value, sixteen.worst_case) == (3, 1.04, "h16 16x1024 q1 bf16 p64")
    assert by_target["fp8, 16 heads"].value == pytest.approx(100.0 / 62.0)
    assert by_target["128 heads, batched"].worst_case == "h128 16x1024 q1 bf16 p64"
    assert by_target["128 heads, batched"].value == pytest.approx(151.0 / 30.0)
    # The page-size-1 row counts in the geometric mean only (0.5 would fail nothing; its time beats FlashMLA).
    geomean = by_target["geometric mean over the anchored cases, any page size"]
    assert geomean.cases == 7
    assert geomean.value == pytest.approx(math.exp(sum(map(math.log, [1.04, 0.9, 0.95, 1.2, 1.35, 1.0, 0.5])) / 7))


@pytest.mark.parametrize(
    "changed, target",
    [
        (_row(16, 16, 1024, x_flashmla=1.06), "16 heads (q1, q2) and batch 1"),
        (_row(128, 1, 4096, x_flashmla=1.06), "16 heads (q1, q2) and batch 1"),
        (_row(128, 64, 4096, time_us=100.0, x_flashmla=1.26), f"128 heads, >= {LARGE_CASE_TOKENS} KV tokens"),
        (_row(128, 16, 1024, time_us=30.0, x_flashmla=1.41), "128 heads, smaller cases"),
        (_row(128, 16, 1024, time_us=31.0, x_flashmla=1.3), "128 heads, batched"),
        (_row(128, 64, None, time_us=300.0, x_floor=1.31, x_flashmla=1.0), "ragged batch (q1, q2)"),
        (_row(16, 16, 1024, kv_dtype="fp8_e4m3", time_us=63.0), "fp8, 16 heads"),
        (_row(128, 64, 4096, kv_dtype="fp8_e4m3", time_us=101.0), "fp8, 128 heads"),
    ],
)
def test_one_case_past_its_bound_misses_that_target_alone(changed, target):
    grid = [r for r in GOOD_GRID if r["case"] != changed["case"] or r["kernel"] != "triton"] + [changed]
    missed = [c.target.split(":")[0] for c in check_targets(grid, SIMPLE) if not c.met]
    assert missed == [target]


def test_the_ragged_batch_counts_its_drawn_tokens_as_a_large_case():
    ragged = _row(128, 64, None, x_flashmla=1.2)
    assert sum(DecodeCase(128, 64, None).lengths()) >= LARGE_CASE_TOKENS
    by_target = _by_target(check_targets([ragged], {}))
    assert by_target[f"128 heads, >= {LARGE_CASE_TOKENS} KV tokens"].cases == 1
    assert by_target["128 heads, smaller cases"].cases == 0


def test_targets_without_cases_say_so():
    line = _by_target(check_targets([_row(64, 16, 1024)], {}))["fp8, 128 heads"].line()
    assert line.startswith("no cases")


def test_anchor_ragged_simple_time_is_scaled_to_our_tokens(tmp_path):
    ours = sum(DecodeCase(128, 64, None).lengths())
    anchors = {"ragged": {"batch": 64, "total_tokens": ours // 2},
               "cases": [{"heads": 128, "batch": 64, "seqlen": "ragged", "simple_triton_q1_us": 1000.0},
                         {"heads": 128, "batch": 16, "seqlen": 1024, "simple_triton_q1_us": 150.0},
                         {"heads": 16, "batch": 1, "seqlen": 1024, "flashmla_q1_us": 9.0}]}
    path = tmp_path / "anchors.json"
    path.write_text(json.dumps(anchors))
    times = anchor_simple_triton_times(path)
    assert times == {(128, 64, None): pytest.approx(1000.0 * ours / (ours // 2)), (128, 16, 1024): 150.0}
    assert anchor_simple_triton_times(tmp_path / "missing.json") == {}


def test_cli_reads_a_grid_written_in_parts(tmp_path):
    paths = []
    for part, rows in enumerate((GOOD_GRID[:5], GOOD_GRID[5:])):
        paths.append(tmp_path / f"part{part}.json")
        paths[-1].write_text(json.dumps({"environment": {}, "results": rows}))
    assert result_rows(paths) == GOOD_GRID
    result = CliRunner().invoke(bench, ["decode-targets", *map(str, paths)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(check_targets(GOOD_GRID, {})) + len(check_round3_targets(GOOD_GRID))
    assert lines[0].startswith("met") and "16 heads (q1, q2) and batch 1" in lines[0]
    assert lines[-6].startswith("no cases") and "round 3, batched" in lines[-6]  # GOOD_GRID has no FlashMLA rows


ROUND3_GRID = [
    _row(128, 64, 1024, time_us=45.0), _row(128, 64, 1024, kernel="flashmla", time_us=46.0),
    _row(16, 16, 4096, q_len=2, time_us=50.0), _row(16, 16, 4096, q_len=2, kernel="flashmla", time_us=50.0),
    _row(128, 1, 16384, time_us=30.0), _row(128, 1, 16384, kernel="flashmla", time_us=44.0),
    _row(64, 64, 1024, time_us=40.0), _row(64, 64, 1024, kernel="flashmla", time_us=30.0),  # 64 heads: no target
    _row(128, 16, 4096, time_us=60.0),  # no FlashMLA row: in no FlashMLA target
    _row(128, 64, 4096, time_us=140.0), _row(128, 64, 4096, kv_dtype="fp8_e4m3", time_us=133.0),
    _row(128, 64, 4096, kv_dtype="fp8_e4m3", kernel="triton_fp8", time_us=120.0),
    _row(128, 64, 4096, q_len=2, kv_dtype="fp8_e4m3", kernel="triton_fp8", time_us=90.0),  # no bf16 twin: none
    _row(128, 4, 1024, time_us=20.0), _row(128, 4, 1024, kv_dtype="fp8_e4m3", time_us=25.0),  # 4096 tokens: none
    _row(16, 64, 4096, time_us=120.0), _row(16, 64, 4096, kv_dtype="fp8_e4m3", time_us=70.0),
    _row(16, 64, 4096, kv_dtype="fp8_e4m3", kernel="triton_fp8", time_us=68.0),
]


def test_round3_targets_pair_our_rows_with_flashmla_rows_of_the_same_case():
    by_target = _by_target(check_round3_targets(ROUND3_GRID))
    assert all(c.met for c in by_target.values()), [c.line() for c in by_target.values() if not c.met]
    batched = by_target["round 3, batched at 16 and 128 heads (q1, q2)"]
    assert (batched.cases, batched.value, batched.worst_case) == (2, 1.0, "h16 16x4096 q2 bf16 p64")
    assert by_target["round 3, batch 1"].value == pytest.approx(30.0 / 44.0)
    fp8_128 = by_target[f"round 3, fp8 at 128 heads, >= {FP8_128_HEAD_TOKENS} KV tokens"]
    assert (fp8_128.cases, fp8_128.value) == (1, pytest.approx(133.0 / 140.0))
    e4m3 = by_target[f"round 3, fp8 at 128 heads with e4m3 scores (triton_fp8), >= {FP8_128_HEAD_TOKENS} KV tokens"]
    assert (e4m3.cases, e4m3.value) == (1, pytest.approx(120.0 / 140.0))
    assert by_target[f"round 3, fp8 at 16 heads, >= {LARGE_CASE_TOKENS} KV tokens"].value == pytest.approx(120 / 70)
    e4m3_16 = by_target[f"round 3, fp8 at 16 heads with e4m3 scores (triton_fp8), >= {LARGE_CASE_TOKENS} KV tokens"]
    assert (e4m3_16.cases, e4m3_16.value) == (1, pytest.approx(120.0 / 68.0))


@pytest.mark.parametrize(
    "changed, target",
    [
        (_row(128, 64, 1024, time_us=46.5), "round 3, batched at 16 and 128 heads (q1, q2)"),
        (_row(128, 1, 16384, time_us=44.5), "round 3, batch 1"),
        (_row(128, 64, 4096, kv_dtype="fp8_e4m3", time_us=134.0),
         f"round 3, fp8 at 128 heads, >= {FP8_128_HEAD_TOKENS} KV tokens"),
        (_row(16, 64, 4096, kv_dtype="fp8_e4m3", time_us=76.0),
         f"round 3, fp8 at 16 heads, >= {LARGE_CASE_TOKENS} KV tokens"),
        (_row(128, 64, 4096, kv_dtype="fp8_e4m3", kernel="triton_fp8", time_us=134.0),
         f"round 3, fp8 at 128 heads with e4m3 scores (triton_fp8), >= {FP8_128_HEAD_TOKENS} KV tokens"),
        (_row(16, 64, 4096, kv_dtype="fp8_e4m3", kernel="triton_fp8", time_us=76.0),
         f"round 3, fp8 at 16 heads with e4m3 scores (triton_fp8), >= {LARGE_CASE_TOKENS} KV tokens"),
    ],
)
def test_one_round3_case_past_its_bound_misses_that_target_alone(changed, target):
    grid = [r for r in ROUND3_GRID if r["case"] != changed["case"] or r["kernel"] != changed["kernel"]] + [changed]
    missed = [c.target.split(":")[0] for c in check_round3_targets(grid) if not c.met]
    assert missed == [target]


def test_an_uneven_batch_meets_no_anchor_and_pairs_with_no_uniform_row():
    """Rows of `DecodeCase(uneven=True)` share heads, batch and seqlen with a uniform shape but not its lengths: no
    anchor time and no bf16 time of the uniform row applies to them, nor theirs to it."""
    def uneven(row):
        return {**row, "uneven": True, "case": row["case"].replace("x", "x~", 1)}

    slow = uneven(_row(128, 64, 4096, time_us=5000.0))  # 510 / 5000: would fail the 5x target against the anchor
    fast_bf16 = uneven(_row(16, 16, 1024, time_us=30.0))  # would make the fp8 rows slower than "our bf16"
    checks = check_targets(GOOD_GRID + [slow, fast_bf16], SIMPLE)
    assert all(c.met for c in checks), [c.line() for c in checks if not c.met]
    assert _by_target(checks)["128 heads, batched"].cases == 3  # GOOD_GRID's own

