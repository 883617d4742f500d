"""Device experiment: host µs per eager `mla_decode(out=)` call (`mlakit bench overhead`'s measure) under several
values of one module setting, the variants alternating over rounds in one process, each variant's calls built with
the setting at its value (a call's metadata prepares its launches then). With `--profile`, each variant's calls
then run again under cProfile, and the functions with the most own time a call are printed (where an extra
launch's host time goes: Triton's C entry, its Python launcher, or the call around them).

Usage: python benchmarks/experiments/host_cost_setting_ab.py MODULE.NAME LABEL=VALUE [LABEL=VALUE ...]
    [+MODULE.NAME=VALUE ...] -- [--profile] CASE [CASE ...]
    e.g. host_cost_setting_ab.py hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE off=False on=True -- decode,128,64,1024,2
(CASE as `mlakit.bench.overhead.OverheadCase.parse`: KIND,HEADS,BATCH,SEQLEN,NEW.)
"""

import cProfile
import pstats
import statistics
import sys
from collections.abc import Callable

import torch
from decode_case import set_setting, setting_variants

from mlakit.bench.overhead import OverheadCase, case_calls
from mlakit.bench.timing import host_us_per_call

CALL = "mla_decode out="
ROUNDS = 3
PROFILED_CALLS = 2000
PROFILE_ROWS = 14


def print_profile(title: str, call: Callable[[], object]) -> None:
    """The functions with the most own time over PROFILED_CALLS back-to-back calls, per call."""
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(PROFILED_CALLS):
        call()
    profile.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profile)
    print(f"{title}: {stats.total_tt / PROFILED_CALLS * 1e6:.1f} us a call under the profiler", flush=True)
    for (path, line, name), (_, calls, own, cumulative, _) in sorted(stats.stats.items(),
                                                                     key=lambda item: -item[1][2])[:PROFILE_ROWS]:
        print(f"  {own / PROFILED_CALLS * 1e6:7.2f} us own {cumulative / PROFILED_CALLS * 1e6:7.2f} us cumulative "
              f"{calls / PROFILED_CALLS:4.1f} a call  {name} ({'/'.join(path.rsplit('/', 2)[-2:])}:{line})", flush=True)


setting, variants, rest = setting_variants(sys.argv[1:])
profiled = "--profile" in rest
device = torch.device("cuda")
for spec in [argument for argument in rest if argument != "--profile"]:
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
    for label, value in variants.items() if profiled else ():
        set_setting(setting, value)
        print_profile(f"{case.label} {label}", calls[label])
