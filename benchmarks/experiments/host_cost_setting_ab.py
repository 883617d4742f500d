"""Device experiment: host µs per eager `mla_decode(out=)` call (`mlakit bench overhead`'s measure) under several
values of one module setting, the variants alternating over rounds in one process, each variant's calls built with
the setting at its value (a call's metadata prepares its launches then).

Usage: python benchmarks/experiments/host_cost_setting_ab.py MODULE.NAME LABEL=VALUE [LABEL=VALUE ...]
    [+MODULE.NAME=VALUE ...] -- CASE [CASE ...]
    e.g. host_cost_setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE off=False on=True -- decode,128,64,1024,2
(CASE as `mlakit.bench.overhead.OverheadCase.parse`: KIND,HEADS,BATCH,SEQLEN,NEW.)
"""

import statistics
import sys

import torch
from decode_case import set_setting, setting_variants

from mlakit.bench.overhead import OverheadCase, case_calls
from mlakit.bench.timing import host_us_per_call

CALL = "mla_decode out="
ROUNDS = 3

setting, variants, specs = setting_variants(sys.argv[1:])
device = torch.device("cuda")
for spec in specs:
    case = OverheadCase.parse(spec)
    calls = {}
    for label, value in variants.items():
        set_setting(setting, value)
        calls[label] = case_calls(case, device)[CALL]
        calls[label]()
    times = {label: [] for label in variants}
    for _ in range(ROUNDS):
        for label, value in variants.items():
            set_setting(setting, value)
            times[label].append(host_us_per_call(calls[label]))
    print(f"{case.label:<26} " + " | ".join(f"{label} {statistics.median(us):6.1f} us host ({min(us):.1f}-{max(us):.1f})"
                                          for label, us in times.items()), flush=True)
