"""Device experiment: our decode under several values of one module setting (e.g. `triton_decode.COMBINE_AFTER_SPLIT`,
NOTES.md v56b; `l2_evict_first.EVICT_FIRST_MAX_ROW_TILES`, v58), under the benchmark's method (CUDA-graph replay, L2
flushed), the variants interleaved over rounds; each variant has its own plan (a plan keeps the launches it prepared,
and settings are read as it prepares them). Outputs are compared with the first variant's first, and each variant's
kernels are profiled.

Usage: python benchmarks/experiments/setting_ab.py MODULE.NAME LABEL=VALUE [LABEL=VALUE ...] [+MODULE.NAME=VALUE ...] --
    [--e4m3-scores] [--hinted] CASE [CASE ...]
    e.g. setting_ab.py l2_evict_first.EVICT_FIRST_MAX_ROW_TILES never=0 always=64 -- 16,16,4096,1 128,64,1024,1
    or setting_ab.py hopper_narrow_decode.WIDE_MIN_TILES_PER_PROGRAM t12=12 t6=6 -- --e4m3-scores --hinted 16,32,4096,2,fp8_e4m3
(a `+` argument holds another setting at its value for every variant; CASE as `DecodeCase.parse`:
HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE[,PAGE_SIZE]]; VALUE a Python literal; the flags plan every case with e4m3 scores / told its cached tokens, as `decode_case.case_plan`.) Each variant's plans are built
with the setting at its value, so settings read at plan time count too.
"""

import sys

import torch
from cuda_profile import flushed_kernel_times
from decode_case import (case_inputs, case_plan, cases_and_plan_flags, decode_call, interleaved_times, set_setting,
                         setting_variants)

from mlakit.bench.decode import DecodeCase

setting, variants, rest = setting_variants(sys.argv[1:])
first = next(iter(variants))


def call_for(variant: str, spec: str):
    """The case's call with the variant's plan, the setting at the variant's value."""
    set_setting(setting, variants[variant])
    return decode_call(cases[spec][0], plans[spec, variant])


specs, plan_flags = cases_and_plan_flags(rest)
cases = {spec: case_inputs(DecodeCase.parse(spec)) for spec in specs}
plans = {}
for variant in variants:  # a plan reads plan-time settings (e.g. `hopper_narrow_decode.WIDE_MIN_TILES_PER_PROGRAM`)
    set_setting(setting, variants[variant])
    for spec, (inputs, _) in cases.items():
        plans[spec, variant] = case_plan(DecodeCase.parse(spec), inputs, **plan_flags)
for spec in cases:
    reference_out, reference_lse = call_for(first, spec)()
    for variant in variants:
        call = call_for(variant, spec)
        out, lse = call()
        torch.cuda.synchronize()
        plan = plans[spec, variant]
        kernels = ", ".join(f"{kernel} {us:.2f}" for kernel, us in flushed_kernel_times(call, 10).items())
        print(f"{spec} {variant}: splits {int(plan.num_splits.min())}-{int(plan.num_splits.max())} "
              f"(ceiling {plan.geometry.max_splits}); against {first}: outputs differ by "
              f"{(out.float() - reference_out.float()).abs().max().item():.2e}, "
              f"lse by {(lse - reference_lse).abs().nan_to_num().max().item():.2e}; kernels (us, flushed): {kernels}",
              flush=True)
times = interleaved_times(list(variants), list(cases), call_for)
for spec in cases:
    base = min(times[spec, first])
    print(f"{spec:<22} " + " | ".join(f"{variant} {min(times[spec, variant]):6.1f} us ({min(times[spec, variant]) / base:.3f})"
                                      for variant in variants), flush=True)
