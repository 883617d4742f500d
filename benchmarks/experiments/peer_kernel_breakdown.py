"""Device experiment: our decode call and FlashMLA's, kernel by kernel, on the same inputs (CUDA time per kernel from
torch.profiler, the L2 flushed before each call), beside each call's CUDA-graph replay time. Tells which part of a
call (main kernel, combine, launches) makes a gap to FlashMLA.

Usage, with FlashMLA built (`scripts/build_flashmla.py`) and on PYTHONPATH:
    python benchmarks/experiments/peer_kernel_breakdown.py 16,16,4096,1 128,64,1024,1
"""

import sys

from cuda_profile import flushed_kernel_times
from decode_case import case_inputs, decode_call

from mlakit.bench.decode import DecodeCase, time_graph_replay
from mlakit.bench.peers import _flashmla_call

for spec in sys.argv[1:]:
    inputs, plan = case_inputs(DecodeCase.parse(spec))
    for name, call in (("mlakit", decode_call(inputs, plan)), ("flashmla", _flashmla_call(inputs))):
        call()
        graph_us = time_graph_replay(call)
        kernels = flushed_kernel_times(call, name_width=48)
        parts = ", ".join(f"{kernel} {us:.2f}" for kernel, us in kernels.items())
        print(f"{spec:<16} {name:<9} graph {graph_us:6.1f} us; kernels (us): {parts}", flush=True)
