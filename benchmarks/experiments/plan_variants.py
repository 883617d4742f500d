"""Device experiment: split plans built with other constants of `decode_split_plan` (e.g. every batch
treated as ragged: units taken dynamically, splits aimed at N x the programs), against the default plan,
interleaved over several rounds in one process under the benchmark's method. Each variant is a fresh copy
of the plan module with its constants replaced (the plan kernel compiles them in).

Usage: python benchmarks/experiments/plan_variants.py HEADS,BATCH,SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import collections
import importlib.util
import sys
from unittest import mock

import torch
import triton.language as tl
from decode_case import decode_call, parse_case

from mlakit.bench.decode import make_inputs, time_graph_replay
from mlakit.kernels import decode_split_plan, triton_decode
from mlakit.kernels.triton_decode import plan_decode

ROUNDS = 3
VARIANTS = {
    "default": {},
    "dynamic": {"RAGGED_NUM": 0, "RAGGED_PROGRAMS": 1},
    "dynamic 2x": {"RAGGED_NUM": 0, "RAGGED_PROGRAMS": 2},
    "dynamic 3x": {"RAGGED_NUM": 0, "RAGGED_PROGRAMS": 3},
}


def plan_module(constants: dict):
    spec = importlib.util.spec_from_file_location(f"plan_variant_{len(constants)}_{id(constants)}", decode_split_plan.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    for name, value in constants.items():
        setattr(module, name, tl.constexpr(value))
    return module


modules = {name: plan_module(constants) for name, constants in VARIANTS.items()}
cases = []
for spec in sys.argv[1:]:
    case = parse_case(spec)
    inputs = make_inputs(case, torch.device("cuda"))
    plans = {}
    for name, module in modules.items():
        with mock.patch.object(triton_decode, "decode_split_counts", module.decode_split_counts):
            plans[name] = plan_decode(inputs.cache_seqlens, q_len=case.q_len, heads=case.heads, kv_dtype=inputs.kv_cache.dtype)
        plan = plans[name]
        print(f"{spec} {name}: splits {int(plan.num_splits.min())}-{int(plan.num_splits.max())}, "
              f"units {int(plan.work_state[0]) * plan.geometry.row_tiles}, dynamic {int(plan.work_state[2])}")
    cases.append((spec, inputs, plans))
times = collections.defaultdict(list)
for _ in range(ROUNDS):
    for name in VARIANTS:
        for spec, inputs, plans in cases:
            times[spec, name].append(time_graph_replay(decode_call(inputs, plans[name])))
for spec, _, _ in cases:
    base = min(times[spec, "default"])
    print(f"{spec:<18} " + " | ".join(f"{name} {min(times[spec, name]):6.1f} us ({min(times[spec, name]) / base:.3f})"
                                      for name in VARIANTS))
