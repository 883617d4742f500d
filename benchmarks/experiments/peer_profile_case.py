"""Device experiment: our decode call and FlashMLA's on the same inputs, one profiled call each, for `ncu` (both
warmed up first; only the calls between cudaProfilerStart and Stop are profiled).

Usage, with FlashMLA built (`scripts/build_flashmla.py`) and on PYTHONPATH:
    ncu --profile-from-start off --clock-control none --set full --import-source no -o /tmp/peer \
        python benchmarks/experiments/peer_profile_case.py 128,64,4096,2
"""

import sys

import torch
from decode_case import case_inputs, decode_call

from mlakit.bench.decode import DecodeCase
from mlakit.bench.peers import _flashmla_call

inputs, plan = case_inputs(DecodeCase.parse(sys.argv[1]))
calls = (decode_call(inputs, plan), _flashmla_call(inputs))
for call in calls:
    for _ in range(2):
        call()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for call in calls:
    call()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
