"""benchmarks/experiments/ab_table_json.py reads the device scripts' A/B lines into rows and per-tree means."""

import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).parents[1] / "benchmarks" / "experiments"

TABLE = """NVIDIA H100 80GB HBM3, 1980 MHz
base round 1: h128 64x4096 q1 bf16 p64     triton         137.5 us   1.32x floor  eager   142.2 us  host   53.6 us   73.2% copy   75.6% matmul  err 1.8e-03  1.000x first
new round 1: h128 64x4096 q1 bf16 p64     triton         133.4 us   1.27x floor  eager   139.2 us  host   55.4 us   75.4% copy   78.8% matmul  err 2.0e-03  1.000x first
base round 2: h128 64x4096 q1 bf16 p64     triton         138.5 us   1.37x floor  eager   145.9 us  host   30.8 us   73.0% copy   72.4% matmul  err 1.8e-03  1.000x first
new round 2: h128 64x4096 q1 bf16 p64     triton         134.4 us   1.27x floor  eager   141.5 us  host   57.2 us   75.2% copy   78.7% matmul  err 1.8e-03  1.000x first
t=110
"""


@pytest.fixture
def tool(monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    yield __import__("ab_table_json")
    sys.modules.pop("ab_table_json", None)


def test_rows_and_means(tool, tmp_path):
    table = tmp_path / "ab.txt"
    table.write_text(TABLE)
    rows = tool.parse_rows(table)
    assert [(row.tree, row.round, row.us) for row in rows] == [("base", 1, 137.5), ("new", 1, 133.4),
                                                               ("base", 2, 138.5), ("new", 2, 134.4)]
    assert rows[1].case == "h128 64x4096 q1 bf16 p64"
    assert rows[1].copy_ceiling_share == pytest.approx(0.754) and rows[1].max_error == pytest.approx(2.0e-3)
    means = {entry["tree"]: entry for entry in tool.means(rows, "base")}
    assert means["base"]["mean_us"] == 138.0 and means["base"]["vs_base"] == 1.0
    assert means["new"]["mean_us"] == 133.9 and means["new"]["rounds"] == 2
    assert means["new"]["vs_base"] == pytest.approx(133.9 / 138.0, abs=1e-4)
