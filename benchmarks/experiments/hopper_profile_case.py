"""Device experiment: one decode call of a case, for `ncu` (the Hopper kernel's second launch is profiled).

Usage: ncu --kernel-name regex:hopper --launch-skip 1 --launch-count 1 ... \
       python benchmarks/experiments/hopper_profile_case.py HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE]
"""

import sys

import torch
from decode_case import case_inputs, decode_call

from mlakit.bench.decode import DecodeCase

call = decode_call(*case_inputs(DecodeCase.parse(sys.argv[1])))
for _ in range(2):
    call()
torch.cuda.synchronize()
