"""Compiles one configuration of each Gluon kernel family, and the decode split-plan kernel of each of the script's
PLANS, for sm_90a with the installed Triton (no GPU needed) and prints each one's `scripts/gluon_compile_check.py`
report line, as one JSON object. tests/test_gluon_compile_check.py runs it in a process of its own: Triton's CPU
interpreter, which other tests run, leaves the language patched for the rest of a process, and a Gluon kernel then no
longer compiles there.

    python tests/gluon_compile_worker.py
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch

from mlakit.kernels import hopper_decode as hd
from mlakit.kernels import hopper_narrow_decode as nd

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gluon_compile_check", ROOT / "scripts" / "gluon_compile_check.py")
check = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = check  # its dataclass looks its module up there
spec.loader.exec_module(check)


def seesaw(kv_dtype: torch.dtype, e4m3: bool) -> str:
    arguments, constants = check.seesaw_arguments(128, 2, kv_dtype, True, e4m3_scores=e4m3)
    with hd.SEESAW.compiling():
        return check.report(lambda: check.compile_like_launch(hd.mla_decode_hopper_seesaw_kernel, arguments,
                                                              constants))


def narrow() -> str:
    arguments, constants = check.narrow_arguments(16, 2, 64, e4m3_scores=True, rows=nd.E4M3_ROWS.value)
    with nd.NARROW.compiling():
        return check.report(lambda: check.compile_like_launch(nd.mla_decode_hopper_narrow_fp8_kernel, arguments,
                                                              constants))


def split(kv_dtype: torch.dtype) -> str:
    kernel, arguments, constants = check.split_arguments(128, 1, kv_dtype, 16)
    return check.report(lambda: check.compile_like_launch(kernel, arguments, constants))


def main() -> None:
    reports = {
        "seesaw bf16": seesaw(torch.bfloat16, False),
        "seesaw fp8": seesaw(hd.FP8_DTYPE, False),
        "seesaw fp8 e4m3 scores": seesaw(hd.FP8_DTYPE, True),
        "narrow fp8": narrow(),
        "split bf16": split(torch.bfloat16),
        "split fp8": split(hd.FP8_DTYPE),
        **{f"plan {name}": check.compile_plan(lengths, heads, shares) for name, lengths, heads, shares in check.PLANS},
        **{f"prefill {kernel}": check.compile_one(64, 32, 64, 64, 2, True, True, torch.bfloat16, kernel)
           for kernel in check.KERNELS},
    }
    print(json.dumps(reports))


if __name__ == "__main__":
    main()
