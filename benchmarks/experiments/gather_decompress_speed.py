"""Device experiment: one prefill pass's gather + decompression, torch (index_select + cuBLAS GEMM)
against the fused Triton kernel (`kernels/gather_decompress.py`) at several tilings, CUDA-graph replay,
with the bf16 matmul ceiling measured in the same run. DeepSeek widths (rank 512, rope 64, nope 128,
v 128), random slots over a cache of twice the rows.

Usage: python benchmarks/experiments/gather_decompress_speed.py OUT.json [HEADS,ROWS ...]
"""

import datetime
import json
import sys

import torch
import triton

from mlakit.bench.ceilings import measure_ceilings
from mlakit.bench.decode import time_graph_replay
from mlakit.kernels.gather_decompress import GatherTuning, gather_decompress
from mlakit.prefill.mha import decompress, gather_rows

RANK, ROPE, NOPE, V = 512, 64, 128, 128
TUNINGS = {"fused 128x128x64 w8 s3": GatherTuning(),
           "fused 128x256x64 w8 s3": GatherTuning(block_n=256),
           "fused 128x128x64 w4 s4": GatherTuning(num_warps=4, num_stages=4),
           "fused 64x128x64 w4 s3": GatherTuning(block_m=64, num_warps=4)}
device = torch.device("cuda")
ceilings = measure_ceilings(device)
cases = [tuple(map(int, c.split(","))) for c in sys.argv[2:]] or [
    (h, m) for h in (128, 16) for m in (512, 4096, 8192, 16384)]
results = []
for heads, rows in cases:
    gen = torch.Generator(device=device).manual_seed(heads + rows)
    cache = torch.randn(2 * rows, RANK + ROPE, generator=gen, device=device).to(torch.bfloat16)
    weight = (torch.randn(heads * (NOPE + V), RANK, generator=gen, device=device) / RANK**0.5).to(torch.bfloat16)
    slots = torch.randperm(2 * rows, generator=gen, device=device)[:rows]
    flops = 2 * rows * heads * (NOPE + V) * RANK
    want = decompress(gather_rows(cache.unsqueeze(1), None, slots, torch.bfloat16), weight, heads, NOPE)
    calls = {"torch index_select + mm": lambda: decompress(gather_rows(cache.unsqueeze(1), None, slots, torch.bfloat16),
                                                            weight, heads, NOPE)}
    for name, tuning in TUNINGS.items():
        got = gather_decompress(cache, slots, weight, heads, NOPE, tuning=tuning)
        error = max((g.float() - w.float()).abs().max().item() / w.float().abs().max().item() for g, w in zip(got, want))
        assert error < 1e-2, (name, error)
        calls[name] = lambda t=tuning: gather_decompress(cache, slots, weight, heads, NOPE, tuning=t)
    for name, call in calls.items():
        us = time_graph_replay(call)
        tflops = flops / us / 1e6
        results.append({"heads": heads, "rows": rows, "call": name, "us": us, "tflops": tflops,
                        "x_matmul_ceiling": tflops / ceilings.matmul_tflop_per_s})
        print(f"h{heads:<4} rows {rows:<6} {name:<26} {us:8.1f} us {tflops:6.0f} TFLOP/s "
              f"{100 * tflops / ceilings.matmul_tflop_per_s:5.1f}% of the matmul ceiling", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "date": datetime.date.today().isoformat(), "ceilings": vars(ceilings), "results": results}, f, indent=1)
