"""The triton backend on a CPU through the public API under TRITON_INTERPRET=1 (debugging kernels on a
laptop): allowed when named, never chosen by auto, refused with a hint without the interpreter."""

import pytest
import torch

import mlakit
from mlakit.attention import functional
from paged_inputs import assert_lse_close, make_paged_batch, relative_error

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="describes a CPU-only machine (conftest sets TRITON_INTERPRET=1)")


@pytest.fixture(autouse=True)
def fresh_backend_choice():
    functional._backend_for.cache_clear()
    yield
    functional._backend_for.cache_clear()


@cpu_only
@pytest.mark.parametrize("q_len, heads", [(1, 16), (3, 5)])
def test_named_triton_runs_on_cpu_tensors_and_matches_the_reference(q_len, heads):
    batch = make_paged_batch([37, 0, 5], heads=heads, q_len=q_len, page_size=16, kv_lora_rank=512, rope_dim=64)
    args = (batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens)
    out, lse = mlakit.mla_decode(*args, softmax_scale=batch.softmax_scale, backend="triton")
    ref, ref_lse = mlakit.reference_decode(*args, kv_lora_rank=512, softmax_scale=batch.softmax_scale)
    assert relative_error(out, ref) < 1e-2
    assert_lse_close(lse, ref_lse, atol=1e-3)


@cpu_only
def test_auto_never_picks_the_interpreter_and_resolve_takes_it_when_named():
    assert functional._backend_for("decode", "auto", "cpu", "bf16", 16, 1, 2, 512, 64, True) == "reference"
    shape = mlakit.MLAShape.preset("deepseek-v3")
    assert mlakit.resolve(mlakit.ServingConfig(device="cpu"), shape).decode_backend == "reference"
    assert mlakit.resolve(mlakit.ServingConfig(device="cpu", decode_backend="triton"), shape).decode_backend == "triton"


@cpu_only
def test_without_the_interpreter_named_triton_is_refused_with_the_hint(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    batch = make_paged_batch([9], heads=2, page_size=16, kv_lora_rank=512, rope_dim=64)
    with pytest.raises(mlakit.ConfigError, match=r"runs on cuda, not on cpu \(or name it with TRITON_INTERPRET=1"):
        mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, softmax_scale=0.1, backend="triton")
