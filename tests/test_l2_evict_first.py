"""L2 evict-first TMA loads: the PTX rewrite, the compile scope that runs it, a real kernel compiled for sm_90a on the
CPU (in a process of its own: tests/evict_first_compile_worker.py), and on an H100 the decode kernels compiled with
the hint exactly where their launches ask for it."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from triton import knobs

import mlakit
from mlakit.kernels.l2_evict_first import MARK, PtxRewriteError, evict_first_tma_loads, streams_evict_first
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
    with pytest.raises(PtxRewriteError, match="0 of its 0 TMA loads"):
        evict_first_tma_loads(_kernel_ptx("mov.u32 %r1, 0;"))


def test_a_marked_kernel_with_a_tma_load_in_a_form_the_rewrite_does_not_know_is_refused():
    multicast = ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%r4], [%rd1, {%r2}], [%r3], %rs1;")
    with pytest.raises(PtxRewriteError, match="1 of its 2 TMA loads"):
        evict_first_tma_loads(_kernel_ptx(LOAD.format(dims=2, n=1), multicast))


def test_tma_stores_are_neither_counted_nor_hinted_and_a_local_stack_is_kept_before_the_policy():
    store = "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r2}], [%r4];"
    ptx = _kernel_ptx(LOAD.format(dims=2, n=1), store).replace(
        "{\n", "{\n\t.local .align 8 .b8 \t__local_depot0[8];\n", 1)
    lines = evict_first_tma_loads(ptx).splitlines()
    assert f"\t{store}" in lines and sum(".L2::cache_hint" in line for line in lines) == 1
    depot = next(i for i, line in enumerate(lines) if "__local_depot0" in line)
    policy = next(i for i, line in enumerate(lines) if "createpolicy" in line)
    assert depot < policy < lines.index(MARK)


def test_the_scope_chains_its_hook_after_the_one_set_and_restores_it():
    seen = []

    def mine(*args):
        if not args:
            return "mine", "0" * 64
        seen.append(args[1]["ptx"])
        return None

    knobs.runtime.add_stages_inspection_hook = mine
    try:
        with ptx_rewritten(evict_first_tma_loads):
            hook = knobs.runtime.add_stages_inspection_hook
            name, digest = hook()
            assert name == "mine" + "mlakit.kernels.l2_evict_first.evict_first_tma_loads" and len(digest) == 64
            stages = {"ptx": lambda src, metadata: _kernel_ptx(LOAD.format(dims=2, n=1))}
            original = stages["ptx"]
            hook(object(), stages, None, None, 90)
            assert seen == [original] and ".L2::cache_hint" in stages["ptx"]("llir", {})
        assert knobs.runtime.add_stages_inspection_hook is mine
    finally:
        knobs.runtime.add_stages_inspection_hook = None


def _compile(marked: bool, prints: bool = False, scoped: bool = True) -> dict:
    """tests/evict_first_compile_worker.py's report, from a process of its own (no CPU interpreter in it)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    # A cache of its own: Triton 3.6's cache key leaves out the pipeline hook, so a compile outside the scope
    # would load what one in the scope cached.
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = cache
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "evict_first_compile_worker.py"),
                               str(int(marked)), str(int(prints)), str(int(scoped))],
                              capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("marked, prints", [(True, False), (False, False), (True, True)])
def test_a_kernel_compiled_for_sm90_in_the_scope_is_hinted_exactly_when_marked(marked, prints):
    """Triton's real PTX for a TMA load (the installed Triton, compiled for sm_90a without a GPU) is what the rewrite
    finds, with or without a local stack, and ptxas takes the rewritten form."""
    report = _compile(marked, prints)
    assert report == {"loads": 1, "hinted": int(marked), "policies": int(marked)}


def test_a_marked_kernel_compiled_outside_the_scope_fails_instead_of_running_unhinted():
    report = _compile(marked=True, scoped=False)
    assert "error" in report and "mlakit_evict_first" in report["error"], report


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
    assert any(key.evict_first == expected for _, key in launch._compiled)
    for (_, key), (compiled, *_) in launch._compiled.items():
        assert (".L2::cache_hint" in compiled.asm["ptx"]) == key.evict_first
