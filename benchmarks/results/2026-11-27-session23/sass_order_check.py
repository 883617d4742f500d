# Session 23: where the narrow kernel's first global loads (LDG, the query rows) and first TMA copies (UTMALDG) sit in its
# SASS (sm_90a, triton 3.6, CPU compile). Run: PYTHONPATH=<triton 3.6>:<tree>/src python sass_order_check.py (from the root).
# "LDG at" lists instructions containing LDG, UTMALDG included.
import sys
sys.path.insert(0, "scripts")
import gluon_compile_check as g
from mlakit.kernels import hopper_narrow_decode as nd
for rows, e4m3, q_len in ((32, True, 2), (16, False, 2)):
    args, consts = g.narrow_arguments(16, q_len, 64, e4m3_scores=e4m3, rows=rows)
    with nd.NARROW.compiling():
        k = g.compile_like_launch(nd.mla_decode_hopper_narrow_fp8_kernel, args, consts)
    ins = [i for i in (g.instruction(l) for l in g.disassembly(k).splitlines()) if i]
    first = {}
    for n, i in enumerate(ins):
        for key in ("LDG", "UTMALDG", "STS", "HGMMA", "F2FP"):
            if key in i.split()[0] or (i.startswith("@") and key in i.split()[1]):
                first.setdefault(key, n)
    ldg = [n for n, i in enumerate(ins) if "LDG" in i][:12]
    tma = [n for n, i in enumerate(ins) if "UTMALDG" in i][:4]
    print(rows, e4m3, "first", first, "LDG at", ldg, "UTMALDG at", tma)
