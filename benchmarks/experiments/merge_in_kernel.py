"""Device experiment: the persistent seesaw merging its split sequences' partials itself (NOTES.md v39)
against the combine kernel, under the benchmark's method, the two interleaved over several rounds (the
run-to-run noise of one case reaches 4%). The combine runs where `hopper_decode.MERGE_MAX_SPLITS` is
below the plan's split ceiling, so setting it to 1 turns the in-kernel merge off.

Usage: python benchmarks/experiments/merge_in_kernel.py HEADS,BATCH,SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import sys

from decode_case import case_inputs, decode_call, interleaved_times, parse_case

from mlakit.kernels import hopper_decode

LIMITS = {"merged in kernel": hopper_decode.MERGE_MAX_SPLITS, "combine kernel": 1}


def call_for(variant: str, spec: str):
    """The case's call with the merge limit of `variant` set (it is read when the call launches)."""
    hopper_decode.MERGE_MAX_SPLITS = LIMITS[variant]
    return decode_call(*inputs[spec])


inputs = {spec: case_inputs(parse_case(spec)) for spec in sys.argv[1:]}
for spec, (_, plan) in inputs.items():
    (out_a, lse_a), (out_b, lse_b) = (call_for(variant, spec)() for variant in LIMITS)
    print(f"{spec}: splits {int(plan.num_splits.min())}-{int(plan.num_splits.max())} (ceiling {plan.geometry.max_splits}), "
          f"outputs differ by {(out_a.float() - out_b.float()).abs().max().item():.2e}, "
          f"lse by {(lse_a - lse_b).abs().nan_to_num().max().item():.2e}")
times = interleaved_times(list(LIMITS), list(inputs), call_for)
for spec in inputs:
    cells = [f"{name} {min(times[spec, name]):7.1f} us ({', '.join(f'{t:.1f}' for t in times[spec, name])})" for name in LIMITS]
    best = [min(times[spec, name]) for name in LIMITS]
    print(f"{spec:<20} " + " | ".join(cells) + f" | ratio {best[0] / best[1]:.3f}")
