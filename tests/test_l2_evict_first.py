"""L2 evict-first TMA loads: the PTX rewrite, the compile scope that runs it, a real kernel compiled for sm_90a on the
CPU, and on an H100 the decode seesaw compiled with the hint exactly where its launch asks for it."""

import importlib.util
from pathlib import Path

import pytest
import torch

import mlakit
from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from mlakit.kernels.hopper_common import matrix_descriptor
from mlakit.kernels.l2_evict_first import (MARK, PtxRewriteError, evict_first_tma_loads, mark_evict_first,
                                          streams_evict_first)
from mlakit.kernels.launch import ptx_rewritten

ROOT = Path(__file__).resolve().parents[1]
LOAD = "cp.async.bulk.tensor.{dims}d.shared::cluster.global.mbarrier::complete_tx::bytes [%r{n}], [%rd1, {{%r2}}], [%r3];"


def _kernel_ptx(*body: str, marked: bool = True) -> str:
    lines = [".visible .entry k(", ")", "{", "\t.reg .b32 \t%r<9>;", "\t.reg .b64 \t%rd<3>;", ""]
    return "\n".join(lines + ([MARK] if marked else []) + [f"\t{line}" for line in body] + ["\tret;", "}", ""])


def test_unmarked_kernels_keep_their_ptx():
    ptx = _kernel_ptx(LOAD.format(dims=2, n=1), marked=False)
    assert evict_first_tma_loads(ptx) == ptx


def test_marked_kernel_loads_every_tile_under_one_policy_made_at_its_entry():
    loads = [LOAD.format(dims=dims, n=n) for n, dims in enumerate((2, 3, 2), start=4)]
    ptx = evict_first_tma_loads(_kernel_ptx(*loads, "mov.u32 %r1, 0;"))
    lines = ptx.splitlines()
    policy = [i for i, line in enumerate(lines) if "createpolicy.fractional.L2::evict_first.b64" in line]
    hinted = [i for i, line in enumerate(lines) if ".L2::cache_hint" in line]
    assert len(policy) == 1 and len(hinted) == 3
    assert policy[0] < lines.index(MARK) < hinted[0]
    assert all(lines[i].endswith("[%r3], %mlakit_evict_first;") for i in hinted)
    assert "mov.u32 %r1, 0;" in ptx and ".reg .b64 \t%mlakit_evict_first;" in ptx


def test_a_marked_kernel_without_tma_loads_is_refused():
    with pytest.raises(PtxRewriteError, match="found 0 TMA tile loads"):
        evict_first_tma_loads(_kernel_ptx("mov.u32 %r1, 0;"))


def test_the_scope_installs_its_pipeline_hook_and_restores_the_one_before():
    def mine(*args):
        return None

    knobs.runtime.add_stages_inspection_hook = mine
    try:
        with ptx_rewritten(evict_first_tma_loads):
            hook = knobs.runtime.add_stages_inspection_hook
            name, digest = hook()
            assert name == "mlakit.kernels.l2_evict_first.evict_first_tma_loads" and len(digest) == 64
            stages = {"ptx": lambda src, metadata: _kernel_ptx(LOAD.format(dims=2, n=1))}
            hook(object(), stages, None, None, 90)
            assert ".L2::cache_hint" in stages["ptx"]("llir", {})
        assert knobs.runtime.add_stages_inspection_hook is mine
    finally:
        knobs.runtime.add_stages_inspection_hook = None


@gluon.jit
def _tile_copy(DESC, OUT, MARKED: gl.constexpr):
    if MARKED:
        mark_evict_first()
    tile = gl.allocate_shared_memory(DESC.dtype, DESC.block_type.shape, DESC.layout)
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    mbarrier.expect(ready, DESC.block_type.nbytes)
    tma.async_copy_global_to_shared(DESC, [0, 0], ready, tile)
    mbarrier.wait(ready, 0)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, DESC.block_type.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, DESC.block_type.shape[1], layout=gl.SliceLayout(0, layout))
    gl.store(OUT + rows[:, None] * DESC.block_type.shape[1] + cols[None, :], tile.load(layout))


def _compile_check_script():
    spec = importlib.util.spec_from_file_location("gluon_compile_check", ROOT / "scripts" / "gluon_compile_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("marked", [True, False])
def test_a_kernel_compiled_for_sm90_in_the_scope_is_hinted_exactly_when_marked(marked):
    """Triton's real PTX for a TMA load (the installed Triton, compiled for sm_90a without a GPU) is what the rewrite
    finds, and ptxas takes the rewritten form."""
    source = torch.empty(64, 64, dtype=torch.bfloat16)
    desc = matrix_descriptor((source.data_ptr(), source.dtype, tuple(source.shape), tuple(source.stride())), (64, 64))
    out = torch.empty(64, 64, dtype=torch.bfloat16)
    with ptx_rewritten(evict_first_tma_loads):
        compiled = _compile_check_script().compile_like_launch(_tile_copy, [desc, out], dict(MARKED=marked, num_warps=4))
    ptx = compiled.asm["ptx"]
    assert ptx.count("cp.async.bulk.tensor") == 1
    assert (".L2::cache_hint" in ptx) == marked and ("createpolicy" in ptx) == marked
    assert compiled.asm["cubin"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Hopper decode kernels need an SM90 GPU")
@pytest.mark.parametrize("heads, q_len, kv_dtype, kernel", [(16, 1, "bf16", "seesaw"), (128, 1, "bf16", "seesaw"),
                                                             (128, 2, "bf16", "seesaw"), (64, 3, "bf16", "seesaw"),
                                                             (16, 2, "fp8_e4m3", "narrow")])
def test_the_decode_kernels_stream_the_cache_evict_first_while_few_row_tiles_read_it(heads, q_len, kv_dtype, kernel):
    """The call's kernel is compiled with the hint exactly when its row tiles allow it (its launch key names the
    choice), and every kernel the launch holds carries the hint exactly when its key says so."""
    from mlakit.kernels import hopper_decode, hopper_narrow_decode
    from mlakit.kernels.triton_decode import plan_decode, triton_mla_decode
    from paged_inputs import make_paged_batch, relative_error

    launch, rows = {"seesaw": (hopper_decode.SEESAW, hopper_decode.BLOCK_M.value),
                    "narrow": (hopper_narrow_decode.NARROW, hopper_narrow_decode.ROWS.value)}[kernel]
    batch = make_paged_batch([3000, 0, 700, 4096] * 4, heads=heads, q_len=q_len, page_size=64, kv_lora_rank=512,
                             rope_dim=64, kv_dtype=kv_dtype, device="cuda", seed=heads * q_len)
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype)
    out, _ = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=512,
                               softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, plan=plan)
    reference, _ = mlakit.reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                           kv_lora_rank=512, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    assert relative_error(out, reference) < 3e-2
    expected = streams_evict_first(-(-heads * q_len // rows))
    assert any(key[-1] == expected for _, key in launch._compiled)
    for (_, key), (compiled, *_) in launch._compiled.items():
        assert (".L2::cache_hint" in compiled.asm["ptx"]) == key[-1]
