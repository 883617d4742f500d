"""Device experiment: ragged batches' splits aimed at N x the programs the GPU runs at once
(`decode_split_plan.RAGGED_PROGRAMS`, 2 by default), under the benchmark's method. Run once per N, in
separate processes (the constant is compiled into the plan kernel).

Usage: python benchmarks/experiments/ragged_oversubscription.py N HEADS,BATCH,SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import sys

import triton.language as tl
from decode_case import case_inputs, decode_call, parse_case

from mlakit.bench.decode import time_graph_replay
from mlakit.kernels import decode_split_plan

decode_split_plan.RAGGED_PROGRAMS = tl.constexpr(int(sys.argv[1]))
for spec in sys.argv[2:]:
    case = parse_case(spec)
    inputs, plan = case_inputs(case)
    time_us = min(time_graph_replay(decode_call(inputs, plan)) for _ in range(2))
    print(f"RAGGED_PROGRAMS {sys.argv[1]} {case.label}: {time_us:.1f} us, splits {int(plan.num_splits.sum())}, "
          f"ragged {int(plan.work_state[2])}")
