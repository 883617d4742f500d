"""Where an eager mla_decode call's host time goes (H100): a cProfile of 300 calls with metadata and
check_inputs=False, 128 heads, 1 x 1024 tokens, q_len 1."""
import cProfile, io, os, pstats

import torch

from mlakit import mla_decode
from mlakit.attention.functional import mla_decode_metadata
from mlakit.bench.decode import DecodeCase, make_inputs
from mlakit.bench.timing import host_us_per_call

OUT = os.environ.get("OUT", "/tmp")
x = make_inputs(DecodeCase(128, 1, 1024), torch.device("cuda"))
md = mla_decode_metadata(x.cache_seqlens, q_len=1, heads=128, backend="triton")
call = lambda: mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, softmax_scale=0.1, backend="triton",
                          metadata=md, check_inputs=False)
print("host us per call", host_us_per_call(call), host_us_per_call(call))
prof = cProfile.Profile()
prof.enable()
for _ in range(300):
    call()
prof.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
open(f"{OUT}/profile.txt", "w").write(s.getvalue())
