"""Device experiment: our decode with its TMA loads carrying an L2 evict-first hint (`evict_first.install` on the Hopper
decode kernels) against without, in alternating processes (the hint is fixed when a kernel compiles, so one process
runs one variant). Prints each case's flushed CUDA-graph replay time and the error against the fp32 reference.

Usage, from the repository root on an SM90 device:
    cd benchmarks/experiments
    for round in 1 2; do for hint in "" --evict-first; do
        PYTHONPATH=../../src python evict_first_ab.py $hint 16,16,4096,1 128,64,1024,1; done; done
"""

import sys

import torch
from decode_case import case_inputs, decode_call, parse_case
from evict_first import install

from mlakit.bench.decode import time_graph_replay
from mlakit.reference import reference_decode

arguments = sys.argv[1:]
hint = bool(arguments) and arguments[0] == "--evict-first"
if hint:
    install(("mla_decode_hopper",))
for spec in arguments[hint:]:
    inputs, plan = case_inputs(parse_case(spec))
    call = decode_call(inputs, plan)
    out, _ = call()
    keep = min(4, inputs.q.shape[0])
    ref, _ = reference_decode(inputs.q[:keep], inputs.kv_cache, inputs.block_table[:keep], inputs.cache_seqlens[:keep],
                              kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale)
    error = float((out[:keep].float() - ref).norm() / ref.norm())
    print(f"{spec:<22} {'evict-first' if hint else 'plain':<11} {time_graph_replay(call):7.1f} us  err {error:.1e}",
          flush=True)
