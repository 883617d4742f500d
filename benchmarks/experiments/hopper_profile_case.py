"""Device experiment: one decode call of a case, for `ncu` (the Hopper kernel's second launch is profiled).

Usage: ncu --kernel-name regex:hopper --launch-skip 1 --launch-count 1 ... \
       python benchmarks/experiments/hopper_profile_case.py HEADS BATCH SEQLEN [Q_LEN [KV_DTYPE]]
"""

import sys

import torch

from mlakit.bench.decode import DecodeCase, make_inputs
from mlakit.kernels.triton_decode import plan_decode, triton_mla_decode

heads, batch, seqlen = (int(x) for x in sys.argv[1:4])
q_len = int(sys.argv[4]) if len(sys.argv) > 4 else 1
kv_dtype = sys.argv[5] if len(sys.argv) > 5 else "bf16"
inputs = make_inputs(DecodeCase(heads, batch, seqlen, q_len, kv_dtype), torch.device("cuda"))
plan = plan_decode(inputs.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=inputs.kv_cache.dtype)
for _ in range(2):
    triton_mla_decode(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                      kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale, plan=plan)
torch.cuda.synchronize()
