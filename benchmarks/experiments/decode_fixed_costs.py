"""Device experiment: what a short decode call's time is made of, under the benchmark's method
(CUDA-graph replay, L2 flushed): the whole call, the split pass alone, the same with a split ceiling
equal to the plan's largest split count (no programs that find no split), the launch of programs
that all find no split, and a graph of one tiny kernel (the timing's own floor).

Usage: python benchmarks/experiments/decode_fixed_costs.py HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import dataclasses
import sys
from unittest import mock

import torch
from decode_case import case_inputs, decode_call

from mlakit.bench.decode import DecodeCase, time_graph_replay
from mlakit.kernels import triton_decode
from mlakit.kernels.triton_decode import plan_decode


def _timed(inputs, plan, with_combine: bool) -> float:
    call = decode_call(inputs, plan)
    if with_combine:
        return time_graph_replay(call)
    # The combine goes through its cached launcher: without it, a call launches the split pass alone.
    with mock.patch.object(triton_decode, "_COMBINE", lambda *args: None):
        return time_graph_replay(call)


tiny = torch.zeros(1, device="cuda")
print(f"tiny kernel graph: {time_graph_replay(lambda: tiny.add_(1)):.1f} us")
for spec in sys.argv[1:]:
    case = DecodeCase.parse(spec)
    inputs, plan = case_inputs(case)
    splits = int(plan.num_splits.max())
    fixed = plan_decode(inputs.cache_seqlens, q_len=case.q_len, heads=case.heads, kv_dtype=inputs.kv_cache.dtype,
                        tuning=dataclasses.replace(plan.tuning, fixed_splits=splits), page_size=inputs.kv_cache.shape[1])
    idle_work = plan.work.clone()
    idle_work[:, 2] = 0
    idle = dataclasses.replace(plan, work=idle_work, work_state=torch.zeros_like(plan.work_state))
    times = {
        "call": _timed(inputs, plan, True),
        "split pass": _timed(inputs, plan, False),
        f"call, ceiling {splits}": _timed(inputs, fixed, True),
        f"split pass, ceiling {splits}": _timed(inputs, fixed, False),
        "idle programs only": _timed(inputs, idle, False),
    }
    grid = plan.work.shape[0] * plan.geometry.row_tiles
    print(f"{case.label}: splits {splits} ({grid} unit slots, "
          f"{int(plan.num_splits.sum()) * plan.geometry.row_tiles} with work): "
          + ", ".join(f"{name} {us:.1f} us" for name, us in times.items()))
