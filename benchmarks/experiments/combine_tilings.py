"""Device experiment: one decode call's time under each combine tiling (splits per step, rows, columns),
the benchmark's method (CUDA-graph replay, L2 flushed).

Usage: python benchmarks/experiments/combine_tilings.py HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN [...]
"""

import sys
from unittest import mock

from decode_case import case_inputs, decode_call

from mlakit.bench.decode import DecodeCase, time_graph_replay
from mlakit.kernels import triton_decode
from mlakit.kernels.triton_decode import CombineTiling

TILINGS = [CombineTiling(*t) for t in ((1, 4, 512), (2, 4, 512), (4, 2, 512), (4, 4, 512), (8, 1, 512), (16, 1, 512),
                                       (16, 1, 128), (4, 1, 128))]

for spec in sys.argv[1:]:
    case = DecodeCase.parse(spec)
    inputs, plan = case_inputs(case)
    call = decode_call(inputs, plan)
    default = triton_decode.combine_tiling(plan.geometry.max_splits, 512)
    times = {"default " + str(tuple(vars(default).values())): time_graph_replay(call)}
    for tiling in TILINGS:
        with mock.patch.object(triton_decode, "combine_tiling", lambda *args, t=tiling: t):
            times[str(tuple(vars(tiling).values()))] = time_graph_replay(call)
    print(f"{case.label} (splits {int(plan.num_splits.min())}-{int(plan.num_splits.max())} of "
          f"{plan.geometry.max_splits}): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
