"""Device experiment: split plans built with other constants of `decode_split_plan` (e.g. every batch
treated as ragged: units taken dynamically, splits aimed at N x the programs; or the ragged rule's
target `RAGGED_PROGRAMS` alone), against the default plan, interleaved over several rounds in one
process under the benchmark's method. Each variant is a fresh copy of the plan module with its
constants replaced (the plan kernel compiles them in).

Usage: python benchmarks/experiments/plan_variants.py HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE] [...]
"""

import importlib.util
import sys
from unittest import mock

import torch
import triton.language as tl
from decode_case import decode_call, interleaved_times

from mlakit.bench.decode import DecodeCase, make_inputs
from mlakit.kernels import decode_split_plan, triton_decode
from mlakit.kernels.triton_decode import plan_decode

VARIANTS = {
    "default": {},
    "dynamic": {"RAGGED_NUM": 0, "RAGGED_PROGRAMS": 1},
    "dynamic 2x": {"RAGGED_NUM": 0, "RAGGED_PROGRAMS": 2},
    "dynamic 3x": {"RAGGED_NUM": 0, "RAGGED_PROGRAMS": 3},
}


def plan_module(name: str, constants: dict):
    spec = importlib.util.spec_from_file_location(f"plan_variant_{name.replace(' ', '_')}", decode_split_plan.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    for constant, value in constants.items():
        setattr(module, constant, tl.constexpr(value))
    return module


modules = {name: plan_module(name, constants) for name, constants in VARIANTS.items()}
inputs, plans = {}, {}
for spec in sys.argv[1:]:
    case = DecodeCase.parse(spec)
    inputs[spec] = make_inputs(case, torch.device("cuda"))
    for name, module in modules.items():
        with mock.patch.object(triton_decode, "decode_split_counts", module.decode_split_counts):
            plan = plan_decode(inputs[spec].cache_seqlens, q_len=case.q_len, heads=case.heads,
                               kv_dtype=inputs[spec].kv_cache.dtype, page_size=inputs[spec].kv_cache.shape[1])
        plans[spec, name] = plan
        print(f"{spec} {name}: splits {int(plan.num_splits.min())}-{int(plan.num_splits.max())}, "
              f"units {int(plan.work_state[0]) * plan.geometry.row_tiles}, dynamic {int(plan.work_state[2])}")
times = interleaved_times(list(VARIANTS), list(inputs), lambda name, spec: decode_call(inputs[spec], plans[spec, name]))
for spec in inputs:
    base = min(times[spec, "default"])
    print(f"{spec:<18} " + " | ".join(f"{name} {min(times[spec, name]):6.1f} us ({min(times[spec, name]) / base:.3f})"
                                      for name in VARIANTS))
