"""Device experiment (NOTES.md v56, v56b): the combine launched as a programmatic dependent of the SM90 split pass
(`triton_decode.COMBINE_AFTER_SPLIT`, where `combine_after_split` allows it) against a plain launch, under the benchmark's method (CUDA-graph replay,
L2 flushed), the variants interleaved over rounds; each variant has its own plan (a plan keeps the launches it
prepared). Outputs are compared first, and the combine's CUDA time is profiled per variant.

Usage: python benchmarks/experiments/combine_pdl_ab.py HEADS,BATCH,SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import sys

import torch
from cuda_profile import flushed_kernel_times
from decode_case import case_inputs, case_plan, decode_call, interleaved_times, parse_case

from mlakit.kernels import triton_decode

VARIANTS = {"plain": False, "pdl": True}


def call_for(variant: str, spec: str):
    """The case's call with the variant's plan (the flag is read when the plan's first call prepares its launch)."""
    triton_decode.COMBINE_AFTER_SPLIT = VARIANTS[variant]
    return decode_call(cases[spec][0], plans[spec, variant])


cases = {spec: case_inputs(parse_case(spec)) for spec in sys.argv[1:]}
plans = {(spec, variant): case_plan(parse_case(spec), inputs) for spec, (inputs, _) in cases.items() for variant in VARIANTS}
for spec in cases:
    reference_out, reference_lse = call_for("plain", spec)()
    for variant in VARIANTS:
        call = call_for(variant, spec)
        out, lse = call()
        torch.cuda.synchronize()
        plan = plans[spec, variant]
        kernels = ", ".join(f"{name} {us:.2f}" for name, us in flushed_kernel_times(call, 10).items())
        print(f"{spec} {variant}: splits {int(plan.num_splits.min())}-{int(plan.num_splits.max())} "
              f"(ceiling {plan.geometry.max_splits}); against plain: outputs differ by "
              f"{(out.float() - reference_out.float()).abs().max().item():.2e}, "
              f"lse by {(lse - reference_lse).abs().nan_to_num().max().item():.2e}; kernels (us, flushed): {kernels}")
times = interleaved_times(list(VARIANTS), list(cases), call_for)
for spec in cases:
    base = min(times[spec, "plain"])
    print(f"{spec:<22} " + " | ".join(f"{name} {min(times[spec, name]):6.1f} us ({min(times[spec, name]) / base:.3f})"
                                      for name in VARIANTS))
