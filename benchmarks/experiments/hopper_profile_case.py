"""Device experiment: one decode call of a case, for `ncu` (the Hopper kernel's second launch is profiled).

Usage: ncu --kernel-name regex:hopper --launch-skip 1 --launch-count 1 ... \
       python benchmarks/experiments/hopper_profile_case.py [--e4m3-scores] [--hinted] \
       HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE]
(the flags plan the case as `decode_case.case_plan` does: S on 8-bit tensor cores, the plan told the cached tokens).
"""

import sys

import torch
from decode_case import case_inputs, cases_and_plan_flags, decode_call

from mlakit.bench.decode import DecodeCase

(spec,), flags = cases_and_plan_flags(sys.argv[1:])
call = decode_call(*case_inputs(DecodeCase.parse(spec), **flags))
for _ in range(2):
    call()
torch.cuda.synchronize()
