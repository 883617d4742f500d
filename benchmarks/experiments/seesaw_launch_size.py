"""Device experiment: the seesaw kernel launched persistent (one program per SM at most, the default)
against one program per unit slot of the plan (programs past the plan's units exit at once), under the
benchmark's method.

Usage: python benchmarks/experiments/seesaw_launch_size.py HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN [...]
"""

import sys
from unittest import mock

from decode_case import case_inputs, decode_call

from mlakit.bench.decode import DecodeCase, time_graph_replay
from mlakit.kernels.hopper_decode import dispatch

for spec in sys.argv[1:]:
    case = DecodeCase.parse(spec)
    inputs, plan = case_inputs(case)
    call = decode_call(inputs, plan)
    times = {"persistent": [], "one unit per program": []}
    for _ in range(2):
        times["persistent"].append(time_graph_replay(call))
        with mock.patch.object(dispatch, "sm_count", lambda device: 1 << 30):
            times["one unit per program"].append(time_graph_replay(call))
    units = int(plan.work_state[0]) * plan.geometry.row_tiles
    slots = plan.work.shape[0] * plan.geometry.row_tiles
    print(f"{case.label} ({units} units of {slots} slots): "
          + ", ".join(f"{name} {min(t):.1f} us" for name, t in times.items()))
