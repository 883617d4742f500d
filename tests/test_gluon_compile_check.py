"""`scripts/gluon_compile_check.py` builds each kernel's arguments by hand (the plan kernel's by recording
`plan_decode`'s launch): they must keep matching the kernels' parameters; and one configuration of each Gluon kernel
family, and the plan kernel, compiles for sm_90a with the installed Triton (the CPU build pins torch 2.13's Triton,
3.7; the CUDA images these kernels were tuned on have 3.6), without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from mlakit.kernels import decode_split_plan, hopper_decode, hopper_narrow_decode, hopper_prefill, triton_decode
from mlakit.kernels.launch import COMPILE_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gluon_compile_check.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gluon_compile_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _runtime_parameters(kernel, constants) -> list[str]:
    return [p.name for p in kernel.params if p.name not in constants]


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, hopper_decode.FP8_DTYPE])
def test_seesaw_arguments_fill_every_parameter(script, kv_dtype):
    arguments, constants = script.seesaw_arguments(16, 4, kv_dtype, merge=True)
    kernel = hopper_decode.mla_decode_hopper_seesaw_kernel
    assert len(arguments) == len(_runtime_parameters(kernel, constants))
    assert {"HEADS", "PAGE_SIZE", "KV_LORA_RANK", "ROPE_DIM", "MERGE"} <= set(constants)
    assert arguments[3].dtype == (torch.float32 if kv_dtype == hopper_decode.FP8_DTYPE else torch.int32)


@pytest.mark.parametrize("kv_dtype, kernel", [(torch.bfloat16, hopper_decode.mla_decode_hopper_split_kernel),
                                              (hopper_decode.FP8_DTYPE, hopper_decode.mla_decode_hopper_fp8_kernel)])
def test_split_arguments_fill_every_parameter(script, kv_dtype, kernel):
    chosen, arguments, constants = script.split_arguments(16, 2, kv_dtype)
    assert chosen is kernel
    assert len(arguments) == len(_runtime_parameters(kernel, constants))
    assert arguments[1].dtype == kv_dtype  # the pages, then the fp8 scale or the block table
    assert arguments[2].dtype == (torch.float32 if kv_dtype == hopper_decode.FP8_DTYPE else torch.int32)


@pytest.mark.parametrize("page_size", [16, 64])
def test_narrow_arguments_fill_every_parameter(script, page_size):
    arguments, constants = script.narrow_arguments(16, 2, page_size)
    kernel = hopper_narrow_decode.mla_decode_hopper_narrow_fp8_kernel
    assert len(arguments) == len(_runtime_parameters(kernel, constants))
    assert arguments[1].block_shape == [min(page_size, 64), 128] and arguments[3].dtype == torch.float32


@pytest.mark.parametrize("kernel_name", ["hopper", "hopper_persistent"])
def test_prefill_arguments_fill_every_parameter(script, kernel_name):
    arguments = script._prefill_arguments(128, 64, 128, 128, torch.bfloat16)
    if kernel_name == "hopper_persistent":
        arguments += script.SCHEDULE
    constexprs = {"NOPE_DIM", "ROPE_DIM", "V_DIM", "BLOCK_N", "STAGES", "CAUSAL", "MERGE", "Q_BUFFERS"}
    kernel = {"hopper": hopper_prefill.mha_prefill_hopper_kernel,
              "hopper_persistent": hopper_prefill.mha_prefill_hopper_persistent_kernel}[kernel_name]
    assert script.KERNELS[kernel_name] is kernel
    assert len(arguments) == len(_runtime_parameters(kernel, constexprs))


def test_plan_arguments_fill_every_parameter_and_take_shares_when_asked(script):
    """The plan kernel's launch as `plan_decode` makes it for a Hopper-tier batch, recorded, not launched; what
    `plan_arguments` patches for it is restored after."""
    patched = [(decode_split_plan, "_split_counts_kernel"), (decode_split_plan, "SHARE_PLAN_TRITONS"),
               (decode_split_plan, "INTERPRET"), (triton_decode, "INTERPRET"), (triton_decode.hopper_common, "serves")]
    before = [getattr(module, name) for module, name in patched]
    kernel = decode_split_plan._split_counts_kernel
    for shares in (True, False):
        arguments, constants = script.plan_arguments([16384] * 24, 128, 1, shares)
        names = kernel.arg_names  # an interpreted function here (TRITON_INTERPRET)
        assert len(arguments) == len([name for name in names if name not in constants])
        assert set(constants) - set(COMPILE_OPTIONS) <= set(names)
        assert constants["enable_fp_fusion"] is True, "the plan kernel's launch names fp fusion as every launch does"
        assert constants["SHARES"] is shares and constants["BLOCK_B"] == 32 and arguments[0].tolist() == [16384] * 24
    assert all(getattr(module, name) is value for (module, name), value in zip(patched, before))


def test_predicated_warp_collectives_finds_only_reductions_and_shuffles_under_a_predicate(script):
    """The two instructions the plan kernel held under Triton 3.7.1 (NOTES.md) and a predicated shuffle; not an
    unpredicated reduction, a predicated global reduction (RED) or other predicated instructions."""
    listing = """
        /*0000*/                   REDUX.SUM.S32 UR6, R2 ;
        /*0010*/              @!P1 REDUX.MAX.S32 UR7, R2 ;
        /*0020*/               @P4 SEL R3, R116, RZ, !P0 ;
        /*0030*/               @P1 REDUX.SUM.S32 UR6, R9 ;
        /*0040*/               @P2 RED.E.ADD.STRONG.GPU desc[UR4][R2.64], R5 ;
        /*0050*/              @!P3 SHFL.BFLY PT, R4, R3, 0x10, 0x1f ;
        /*0060*/               @UP1 UMOV UR10, UR6 ;
    """
    assert script.predicated_warp_collectives(listing) == [
        "@!P1 REDUX.MAX.S32 UR7, R2", "@P1 REDUX.SUM.S32 UR6, R9", "@!P3 SHFL.BFLY PT, R4, R3, 0x10, 0x1f"]


def test_scan_cache_reports_every_cubin_of_a_cache_folder_by_entry_and_kernel(script, tmp_path):
    """A cache folder as a GPU run leaves it (an entry folder a build, its cubin named after the kernel): every cubin
    found, nested or not, each with its predicated warp collectives (here from stand-in listings)."""
    for entry, kernel in [("ENTRYONE0123", "_split_counts_kernel"), ("ENTRYTWO4567", "combine_kernel")]:
        (tmp_path / entry).mkdir()
        (tmp_path / entry / f"{kernel}.cubin").write_bytes(b"")
        (tmp_path / entry / f"{kernel}.json").write_text("{}")
    listings = {"_split_counts_kernel": "/*0010*/   @!P1 REDUX.MAX.S32 UR7, R2 ;",
                "combine_kernel": "/*0010*/   EXIT ;"}
    found = script.scan_cache(tmp_path, disassemble=lambda cubin: listings[cubin.stem])
    assert found == {"ENTRYONE01/_split_counts_kernel": ["@!P1 REDUX.MAX.S32 UR7, R2"], "ENTRYTWO45/combine_kernel": []}


def test_instruction_digest_ignores_register_numbers_and_addresses_but_not_order(script):
    listing = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   IMAD.MOV.U32 R4, RZ, RZ, R2.reuse ;
        /*0020*/               @P0 BRA `(.L_x_3) ;
    """
    renamed = listing.replace("R4", "R7").replace("R2.reuse", "R9").replace("P0", "P2").replace("L_x_3", "L_x_8")
    reordered = "\n".join(listing.splitlines()[:1] + listing.splitlines()[2:3] + listing.splitlines()[1:2]
                          + listing.splitlines()[3:])
    count, digest = script.instruction_digest(listing)
    assert count == 3
    assert script.instruction_digest(renamed) == (3, digest)
    assert script.instruction_digest(reordered)[1] != digest
    assert script.instruction_digest(listing.replace("IMAD.MOV.U32", "MOV"))[1] != digest


LISTING = """
        //## File "/src/kernel.py", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        //## File "/src/kernel.py", line 20
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0, 0x80 ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        //## File "/src/other.py", line 5
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x2, 0x80 ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x2, 0x80 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0xa, 0x100 ;
        /*0060*/              @P0 BRA `(.L_x_1) ;
        /*0070*/                   BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""


def test_loop_syncs_counts_warpgroup_syncs_of_innermost_loops_by_line(script):
    """The inner loop (.L_x_1 .. its branch back) holds two 128-thread syncs from other.py:5; the named barrier of
    256 threads and the sync before the inner loop's label are not counted, and the outer loop is not innermost."""
    (size, by_line), = script.loop_syncs(LISTING, min_size=2)
    assert size == 5 and dict(by_line) == {"other.py:5": 2}
    assert script.loop_syncs(LISTING, min_size=6) == []


def test_every_gluon_kernel_family_compiles_for_sm90_with_the_installed_triton(script):
    """tests/gluon_compile_worker.py in a process of its own (no CPU interpreter in it, a Triton cache of its own):
    the decode seesaw (bf16; fp8 with fp16 and with e4m3 scores), the narrow fp8 kernel, both split kernels and both
    prefill kernels compile, e.g. no Gluon builtin the installed Triton lacks (3.7 renamed `thread_barrier` to
    `barrier`, 3.9 removed the TMA and cp.async copies' old names and `_reinterpret`: `kernels/gluon_compat`); so does the split-plan kernel (the script's PLANS), and no kernel holds a warp reduction or shuffle
    that ptxas if-converted (for 3.7 it predicated the plan kernel's on the wrong register:
    `predicated_warp_collectives`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = cache
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "gluon_compile_worker.py")], capture_output=True,
                              text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    plans = {f"plan {name}" for name, *_ in script.PLANS}
    assert set(reports) == {"seesaw bf16", "seesaw fp8", "seesaw fp8 e4m3 scores", "narrow fp8", "split bf16",
                            "split fp8", "prefill hopper", "prefill hopper_persistent"} | plans
    failed = {name: line for name, line in reports.items() if not line.startswith("ok")}
    assert not failed, failed
    predicated = {name: line for name, line in reports.items() if not line.endswith("predicated warp collectives 0")}
    assert not predicated, predicated
