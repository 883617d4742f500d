"""Device experiment: one prefill attention call of a `bench prefill` case, for `ncu`, mlakit's kernel (bf16, or fp8
on operands rounded beforehand) or SDPA's on the same data. The call runs twice untimed, then once between cudaProfilerStart/Stop, so
`ncu --profile-from-start off` sees that call's kernels alone.

Usage: ncu --profile-from-start off --clock-control none --section ... \
       python benchmarks/experiments/prefill_profile_case.py triton|triton_fp8|sdpa HEADS,BATCH,NEW,PREFIX
"""

import sys

import torch

from mlakit.bench.prefill import PrefillCase, _fp8_kernel, _sdpa, _triton_kernel, make_attention_inputs

kind, spec = sys.argv[1], sys.argv[2]
inputs = make_attention_inputs(PrefillCase.parse(spec), torch.device("cuda"))
kernels = {"triton": _triton_kernel(None), "triton_fp8": _fp8_kernel(quantize_in_call=False), "sdpa": _sdpa}
call = kernels[kind](inputs)
for _ in range(2):
    call()
torch.cuda.synchronize()
torch.cuda.profiler.start()
call()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
