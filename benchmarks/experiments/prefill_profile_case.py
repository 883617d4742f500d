"""Device experiment: one prefill attention call of a `bench prefill` case, for `ncu`, mlakit's kernel or SDPA's
on the same data. The call runs twice untimed, then once between cudaProfilerStart/Stop, so
`ncu --profile-from-start off` sees that call's kernels alone.

Usage: ncu --profile-from-start off --clock-control none --section ... \
       python benchmarks/experiments/prefill_profile_case.py triton|sdpa HEADS,BATCH,NEW,PREFIX
"""

import sys

import torch

from mlakit.bench.prefill import PrefillCase, _sdpa, _triton_kernel, make_attention_inputs

kind, spec = sys.argv[1], sys.argv[2]
inputs = make_attention_inputs(PrefillCase.parse(spec), torch.device("cuda"))
call = _triton_kernel(None)(inputs) if kind == "triton" else _sdpa(inputs)
for _ in range(2):
    call()
torch.cuda.synchronize()
torch.cuda.profiler.start()
call()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
