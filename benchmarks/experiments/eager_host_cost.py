"""Where an eager call's host time goes (H100): cProfiles of 300 calls of mla_decode (metadata,
check_inputs=False, out=; 128 heads, 1 x 1024, q_len 1) and of mla_prefill (128 heads, 512 new tokens)."""
import cProfile, io, os, pstats

import torch

from mlakit.bench.overhead import OverheadCase, case_calls
from mlakit.bench.timing import host_us_per_call

OUT = os.environ.get("OUT", "/tmp")
device = torch.device("cuda")
for case, name in [(OverheadCase("decode", 128, 1, 1024), "mla_decode out="),
                   (OverheadCase("prefill", 128, 1, 512, 512), "mla_prefill"),
                   (OverheadCase("decode", 128, 1, 1024), "compat flashinfer run")]:
    call = case_calls(case, device)[name]
    print(case.label, name, "host us per call", round(host_us_per_call(call), 1))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        call()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    with open(f"{OUT}/profile.txt", "a") as f:
        f.write(f"=== {case.label} {name}\n{s.getvalue()}\n")
