"""Turns the A/B tables the device scripts print (`TREE round N: CASE triton T us ... C% copy M% matmul err E ...`,
one line per tree, round and case, from `mlakit bench decode --backends triton --no-baseline`) into one results JSON:
every row, each tree's mean per case and its ratio to a base tree's mean.

Example:
    python ab_table_json.py --base ab_v69 --tree ab_v69="v69 (HEAD)" --tree v70="half-tile copies" \\
        --device "NVIDIA H100 80GB HBM3" --torch 2.11 --triton 3.6.0 ab.txt > ab.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

ROW = re.compile(r"^(?P<tree>\S+) round (?P<round>\d+): (?P<case>.+?)\s+triton\s+(?P<us>[\d.]+) us .*?"
                 r"(?P<copy>[\d.]+)% copy\s+(?P<matmul>[\d.]+)% matmul\s+err (?P<err>[\d.e+-]+)")


@dataclass(frozen=True)
class Row:
    file: str
    tree: str
    round: int
    case: str
    us: float
    copy_ceiling_share: float
    matmul_ceiling_share: float
    max_error: float


def parse_rows(path: Path) -> list[Row]:
    """The A/B rows of one table file (other lines are skipped)."""
    rows = []
    for line in path.read_text().splitlines():
        found = ROW.match(line.strip())
        if found:
            rows.append(Row(path.name, found["tree"], int(found["round"]), found["case"], float(found["us"]),
                            round(float(found["copy"]) / 100, 4), round(float(found["matmul"]) / 100, 4),
                            float(found["err"])))
    return rows


def means(rows: list[Row], base: str | None) -> list[dict]:
    """Each (file, tree, case)'s mean time over its rounds, with its ratio to the base tree's mean in that file."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for row in rows:
        groups.setdefault((row.file, row.tree, row.case), []).append(row.us)
    out = []
    for (file, tree, case), times in groups.items():
        entry = {"file": file, "tree": tree, "case": case, "mean_us": round(statistics.fmean(times), 2),
                 "rounds": len(times)}
        base_times = groups.get((file, base, case)) if base else None
        if base_times:
            entry["vs_base"] = round(statistics.fmean(times) / statistics.fmean(base_times), 4)
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", type=Path)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=WHAT", help="what a tree is")
    parser.add_argument("--base", help="tree the others are compared with")
    parser.add_argument("--device", required=True)
    parser.add_argument("--torch", required=True)
    parser.add_argument("--triton", required=True)
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    args = parser.parse_args()
    rows = [row for table in args.tables for row in parse_rows(table)]
    if not rows:
        parser.error("no A/B rows in " + ", ".join(map(str, args.tables)))
    print(json.dumps({
        "date": args.date, "device": args.device, "torch": args.torch, "triton": args.triton,
        "method": "mlakit bench decode --backends triton --no-baseline --clean-l2 (CUDA-graph replay, L2 full of "
                  "clean lines before each), source trees in alternating processes; shares are of the copy and "
                  "matmul ceilings the bench measured in each process",
        "trees": dict(tree.split("=", 1) for tree in args.tree),
        "rows": [asdict(row) for row in rows],
        "means": means(rows, args.base),
    }, indent=1))


if __name__ == "__main__":
    main()
