"""Device experiment: where one decode call's time goes, kernel by kernel (split pass, combine).

Usage: python benchmarks/experiments/decode_kernel_breakdown.py HEADS,BATCH,SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
Prints, per case, the mean CUDA time of each kernel over 20 calls (torch.profiler) and the split plan.
"""

import collections
import sys

import torch
from decode_case import case_inputs, decode_call, parse_case
from torch.profiler import ProfilerActivity, profile

CALLS = 20

for spec in sys.argv[1:]:
    case = parse_case(spec)
    inputs, plan = case_inputs(case)
    call = decode_call(inputs, plan)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    totals = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:40]] += event.device_time / CALLS
    splits = plan.num_splits.tolist()
    print(f"{case.label}: splits {min(splits)}-{max(splits)} (grid {plan.geometry}),",
          ", ".join(f"{name} {us:.1f} us" for name, us in totals.most_common()))
