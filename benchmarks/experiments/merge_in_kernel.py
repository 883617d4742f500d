"""Device experiment: the persistent seesaw merging its split sequences' partials itself (NOTES.md v39)
against the combine kernel, and fixed split counts merged in the kernel (NOTES.md v41), under the
benchmark's method, the variants interleaved over several rounds (the run-to-run noise of one case
reaches 4%). The combine runs where `hopper_decode.dispatch.MERGE_MAX_SPLITS` is below the plan's split
ceiling, so setting it to 1 turns the in-kernel merge off; a fixed-split plan's ceiling is its count.
Every variant gets a plan of its own: a plan keeps the launches it prepared (and with them the merge
decision), so variants sharing one would all run the first one's.

Usage: python benchmarks/experiments/merge_in_kernel.py [--variants=default,merged] HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import dataclasses
import sys

import torch
from decode_case import case_inputs, case_plan, decode_call, interleaved_times

from mlakit.bench.decode import DecodeCase
from mlakit.kernels.hopper_decode import dispatch
from mlakit.kernels.triton_decode import default_tuning

# name: (MERGE_MAX_SPLITS, fixed split count or None for the default plan)
VARIANTS = {
    "default": (dispatch.MERGE_MAX_SPLITS, None),
    "combine": (1, None),
    "merged": (1024, None),
    "fixed 2 merged": (1024, 2),
    "fixed 4 merged": (1024, 4),
    "fixed 8 merged": (1024, 8),
}


def plan_for(variant: str, spec: str):
    inputs, _ = cases[spec]
    fixed = VARIANTS[variant][1]
    case = DecodeCase.parse(spec)
    tuning = None if fixed is None else dataclasses.replace(default_tuning(case.heads * case.q_len, hopper_tier=True),
                                                           fixed_splits=fixed)
    return case_plan(case, inputs, tuning)


def call_for(variant: str, spec: str):
    """The case's call with the variant's plan and merge limit (the limit is read when the call launches)."""
    dispatch.MERGE_MAX_SPLITS = VARIANTS[variant][0]
    return decode_call(cases[spec][0], plans[spec, variant])


arguments = sys.argv[1:]
if arguments and arguments[0].startswith("--variants="):
    VARIANTS = {name: VARIANTS[name] for name in arguments.pop(0).split("=", 1)[1].split(",")}
cases = {spec: case_inputs(DecodeCase.parse(spec)) for spec in arguments}
plans = {(spec, variant): plan_for(variant, spec) for spec in cases for variant in VARIANTS}
for spec in cases:
    reference_out, reference_lse = call_for(next(iter(VARIANTS)), spec)()
    for variant in VARIANTS:
        plan = plans[spec, variant]
        out, lse = call_for(variant, spec)()
        print(f"{spec} {variant}: splits {int(plan.num_splits.min())}-{int(plan.num_splits.max())} "
              f"(ceiling {plan.geometry.max_splits}), against the first variant: outputs differ by "
              f"{(out.float() - reference_out.float()).abs().max().item():.2e}, "
              f"lse by {(lse - reference_lse).abs().nan_to_num().max().item():.2e}")
torch.cuda.synchronize()
times = interleaved_times(list(VARIANTS), list(cases), call_for)
for spec in cases:
    base = min(times[spec, "default"])
    print(f"{spec:<18} " + " | ".join(f"{name} {min(times[spec, name]):6.1f} us ({min(times[spec, name]) / base:.3f})"
                                      for name in VARIANTS))
