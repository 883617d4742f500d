"""Device experiment: the split plan kernel's own CUDA time (`decode_split_plan._split_counts_kernel`, once a decode
step where the engine plans per step) with and without equal shares (`decode_split_plan.EQUAL_SHARES`, a constexpr of
the kernel), beside the decode call it plans for, and the units' order each plan took.

Usage: python benchmarks/experiments/plan_kernel_time.py CASE [...]
(CASE as `DecodeCase.parse`: HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE[,PAGE_SIZE]].)
"""

import sys

import torch
from cuda_profile import kernel_times
from decode_case import case_plan, decode_call

from mlakit.bench.decode import DecodeCase, make_inputs
from mlakit.kernels import decode_split_plan

CALLS = 50
ORDERS = {decode_split_plan.ORDER_WAVES.value: "waves", decode_split_plan.ORDER_TAKEN.value: "taken",
          decode_split_plan.ORDER_SHARES.value: "shares"}

for spec in sys.argv[1:]:
    case = DecodeCase.parse(spec)
    inputs = make_inputs(case, torch.device("cuda"))
    cells = []
    for shares in (False, True):
        decode_split_plan.EQUAL_SHARES = shares
        plan = case_plan(case, inputs)
        plan_us = sum(us for name, (us, _) in kernel_times(lambda: case_plan(case, inputs), CALLS).items()
                      if "split_counts" in name)
        decode_us = sum(us for us, _ in kernel_times(decode_call(inputs, plan), CALLS).values())
        cells.append(f"shares {'on' if shares else 'off'}: plan kernel {plan_us:.1f} us, decode kernels "
                     f"{decode_us:.1f} us ({ORDERS[int(plan.work_state[2])]})")
    print(f"{case.label}: " + "; ".join(cells))
