"""Host µs per eager call of a few `bench overhead` calls, with FlashInfer fa3's in the same process as the
yardstick (the device hosts' CPUs differ by up to 2x between machines and drift within one). Run it under
two source trees in alternating processes to compare code versions on one machine, e.g.
    for r in 1 2 3; do for t in ab_old/src src; do PYTHONPATH=$t:tests python benchmarks/experiments/host_cost_ab.py $t; done; done
Prints one JSON line per (tree, case, call)."""
import json
import sys

import torch

from mlakit.bench.overhead import OverheadCase, case_calls
from mlakit.bench.timing import host_us_per_call

CASES = ["decode,16,1,1024,1", "decode,128,1,1024,1", "prefill,128,1,128,128", "prefill,16,1,128,128"]
CALLS = ("mla_decode out=", "mla_prefill", "mla_prefill out=", "FlashInfer fa3")

tree = sys.argv[1] if len(sys.argv) > 1 else "src"
device = torch.device("cuda")
for spec in CASES:
    case = OverheadCase.parse(spec)
    calls = case_calls(case, device)
    for name in CALLS:
        if name in calls:
            print(json.dumps({"tree": tree, "case": case.label, "call": name,
                              "host_us": round(host_us_per_call(calls[name]), 2)}), flush=True)
