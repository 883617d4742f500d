"""Device experiment: where one decode call's time goes, kernel by kernel (split pass, combine).

Usage: python benchmarks/experiments/decode_kernel_breakdown.py HEADS,BATCH,SEQLEN,Q_LEN[,KV_DTYPE] [...]
Prints, per case, the mean CUDA time of each kernel over 20 calls (torch.profiler) and the split plan.
"""

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from mlakit.bench.decode import DecodeCase, make_inputs
from mlakit.kernels.triton_decode import plan_decode, triton_mla_decode

CALLS = 20

for spec in sys.argv[1:]:
    fields = spec.split(",")
    heads, batch, seqlen, q_len = (int(x) for x in fields[:4])
    kv_dtype = fields[4] if len(fields) > 4 else "bf16"
    inputs = make_inputs(DecodeCase(heads, batch, seqlen, q_len, kv_dtype), torch.device("cuda"))
    plan = plan_decode(inputs.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=inputs.kv_cache.dtype)

    def call():
        return triton_mla_decode(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                 kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale, plan=plan)

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
    print(f"h{heads} {batch}x{seqlen} q{q_len} {kv_dtype}: splits {min(splits)}-{max(splits)} (grid {plan.geometry}),",
          ", ".join(f"{name} {us:.1f} us" for name, us in totals.most_common()))
