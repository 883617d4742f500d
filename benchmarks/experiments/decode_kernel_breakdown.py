"""Device experiment: where one decode call's time goes, kernel by kernel (split pass, combine), beside the call's
CUDA-graph replay time with a clean L2 (what the kernels leave to launch gaps shows as the difference).

Usage: python benchmarks/experiments/decode_kernel_breakdown.py [--e4m3-scores] [--hinted] CASE [...]
(CASE as `DecodeCase.parse`: HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE[,PAGE_SIZE]].) Prints, per case, the
mean CUDA time of each kernel over 20 calls (torch.profiler) and the split plan; `--e4m3-scores` plans fp8 pages with S on 8-bit
tensor cores, `--hinted` tells the plan the batch's cached tokens (`plan_decode`'s `kv_tokens_hint`).
"""

import sys

import torch
from cuda_profile import kernel_times
from decode_case import case_plan, cases_and_plan_flags, decode_call

from mlakit.bench.decode import DecodeCase, make_inputs, time_graph_replay

CALLS = 20

specs, plan_flags = cases_and_plan_flags(sys.argv[1:])
for spec in specs:
    case = DecodeCase.parse(spec)
    inputs = make_inputs(case, torch.device("cuda"))
    plan = case_plan(case, inputs, **plan_flags)
    call = decode_call(inputs, plan)
    totals = kernel_times(call, CALLS, name_width=40)
    replay = time_graph_replay(call, "clean-l2")
    splits = plan.num_splits.tolist()
    print(f"{case.label} (block_m {plan.tuning.block_m}): splits {min(splits)}-{max(splits)} (grid {plan.geometry}), "
          f"graph replay {replay:.1f} us clean L2;",
          ", ".join(f"{name} {us:.1f} us" for name, (us, _) in sorted(totals.items(), key=lambda kv: -kv[1][0])),
          flush=True)
