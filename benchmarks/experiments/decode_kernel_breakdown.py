"""Device experiment: where one decode call's time goes, kernel by kernel (split pass, combine).

Usage: python benchmarks/experiments/decode_kernel_breakdown.py HEADS,BATCH,SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
Prints, per case, the mean CUDA time of each kernel over 20 calls (torch.profiler) and the split plan.
"""

import sys

from cuda_profile import kernel_times
from decode_case import case_inputs, decode_call, parse_case

CALLS = 20

for spec in sys.argv[1:]:
    case = parse_case(spec)
    inputs, plan = case_inputs(case)
    call = decode_call(inputs, plan)
    totals = kernel_times(call, CALLS, name_width=40)
    splits = plan.num_splits.tolist()
    print(f"{case.label}: splits {min(splits)}-{max(splits)} (grid {plan.geometry}),",
          ", ".join(f"{name} {us:.1f} us" for name, (us, _) in sorted(totals.items(), key=lambda kv: -kv[1][0])))
