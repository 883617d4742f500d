"""Device experiment: the same decode calls through different Hopper split-pass launchers.

Usage: python benchmarks/experiments/hopper_kernel_variants.py OUT.json HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN [...]
Each entry of VARIANTS replaces `hopper_decode.launch` (same arguments, and returning whether the kernel
merged the partials itself); to compare a kernel change,
add its launcher beside "current". Every case is checked against the reference, then timed as
`mlakit bench decode` times it (CUDA-graph replay, L2 flushed), and written to OUT.json.
"""

import json
import sys
import unittest.mock

import torch

from mlakit.bench.ceilings import measure_ceilings
from mlakit.bench.cli import _tuned_kernel
from mlakit.bench.decode import DecodeCase, environment, run_cases
from mlakit.kernels import hopper_decode

VARIANTS = {"current": hopper_decode.launch}


def _patched(factory, launch):
    def prepare(inputs):
        call = factory(inputs)

        def patched_call():
            with unittest.mock.patch.object(hopper_decode, "launch", launch):
                return call()

        return patched_call

    return prepare


device = torch.device("cuda")
ceilings = measure_ceilings(device)
kernels = {name: _patched(_tuned_kernel(None), launch) for name, launch in VARIANTS.items()}
rows = run_cases([DecodeCase.parse(spec) for spec in sys.argv[2:]], kernels, device, ceilings, print)
with open(sys.argv[1], "w") as f:
    json.dump({"environment": environment(device, ceilings), "rows": rows}, f, indent=1)
