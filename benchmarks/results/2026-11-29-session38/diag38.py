"""Device probe: the split-plan kernel's share plan for 24 x 16384 tokens, q1, 128 heads, 132 SMs (two rounds: 132
work items expected), under whichever Triton and mlakit are first on the path; the share guard is bypassed.

    python diag38.py OUTDIR TAG
Prints the work state and the per-sequence counts; saves the launch's TTGIR, PTX and SASS (OUTDIR/TAG.*) and its
scalar arguments (OUTDIR/TAG.args), to compare with a CPU compile of the same specialization.
"""
import subprocess
import sys
from pathlib import Path

import torch
import triton

from mlakit.kernels import decode_split_plan, triton_decode

out_dir, tag = Path(sys.argv[1]), sys.argv[2]
decode_split_plan.SHARE_PLAN_TRITONS = ("",)
launches = []


class RecordedKernel:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            launches.append((self.kernel[grid](*args, **kwargs), args, kwargs))
            return launches[-1][0]
        return launch


decode_split_plan._split_counts_kernel = RecordedKernel(decode_split_plan._split_counts_kernel)
lengths = torch.full((24,), 16384, dtype=torch.int32, device="cuda")
plan = triton_decode.plan_decode(lengths, q_len=1, heads=128, kv_dtype=torch.bfloat16, num_sms=132, page_size=64)
torch.cuda.synchronize()
print(tag, "triton", triton.__version__, decode_split_plan.__file__)
print(tag, "work_state", plan.work_state.tolist(), "num_splits", plan.num_splits.tolist())
compiled, args, kwargs = launches[-1]
for name in ("ttgir", "ptx"):
    (out_dir / f"{tag}.{name}").write_text(compiled.asm[name])
cubin = out_dir / f"{tag}.cubin"
cubin.write_bytes(compiled.asm["cubin"])
nvdisasm = Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
if not nvdisasm.exists():
    nvdisasm = Path("/usr/local/cuda-13.0/bin/nvdisasm")
sass = subprocess.run([str(nvdisasm), "-g", "-c", str(cubin)], capture_output=True, text=True)
(out_dir / f"{tag}.sass").write_text(sass.stdout + sass.stderr)
scalars = [a if not torch.is_tensor(a) else f"tensor{tuple(a.shape)} ptr%16={a.data_ptr() % 16}" for a in args]
(out_dir / f"{tag}.args").write_text(f"{scalars}\n{kwargs}\n")
cubin.unlink()
