"""Our kernel's time per case in one benchmark run against another (e.g. a kernel version against the
last one), with the ratio per case and its geometric mean.

Usage: python benchmarks/experiments/compare_grids.py --old OLD.json [...] --new NEW.json [...] [--bf16-only]
"""

import argparse
import json
import math


def _triton_rows(paths: list[str]) -> dict[str, dict]:
    return {row["case"]: row for path in paths for row in json.load(open(path))["results"] if row["kernel"] == "triton"}


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--old", nargs="+", required=True)
parser.add_argument("--new", nargs="+", required=True)
parser.add_argument("--bf16-only", action="store_true")
args = parser.parse_args()
old, new = _triton_rows(args.old), _triton_rows(args.new)
ratios = []
for case, row in new.items():
    if case not in old or (args.bf16_only and "bf16" not in case):
        continue
    ratio = row["time_us"] / old[case]["time_us"]
    ratios.append(ratio)
    anchor = f"  {row['x_flashmla_anchor']:.2f}x FlashMLA" if row.get("x_flashmla_anchor") else ""
    print(f"{case:<32} {old[case]['time_us']:8.1f} -> {row['time_us']:8.1f} us  {ratio:5.3f}  "
          f"{row['x_floor']:.2f}x floor{anchor}")
print(f"{len(ratios)} cases, geometric mean new / old {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
