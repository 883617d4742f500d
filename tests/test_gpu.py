"""The reference on a CUDA device (run on the device machine; skipped without CUDA)."""

import pytest
import torch

import mlakit
from paged_inputs import assert_lse_close, make_paged_batch, naive_decode, relative_error

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv_dtype, layout", [("bf16", "tensor"), ("fp8_e4m3", "group")])
def test_mla_decode_on_cuda_matches_oracle(kv_dtype, layout):
    batch = make_paged_batch(
        [300, 0, 1, 129], heads=16, q_len=2, page_size=64, kv_lora_rank=512, rope_dim=64,
        kv_dtype=kv_dtype, scale_layout=layout, device="cuda",
    )
    out, lse = mlakit.mla_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale
    )
    assert out.is_cuda and lse.is_cuda
    expected_out, expected_lse = naive_decode(batch)
    fp8 = kv_dtype == "fp8_e4m3"
    assert relative_error(out, expected_out) < (3e-2 if fp8 else 1e-2)
    assert_lse_close(lse, expected_lse, atol=3e-2 if fp8 else 1e-3)


def test_reference_decode_runs_without_host_sync_when_checks_are_off():
    batch = make_paged_batch([70, 5], heads=8, page_size=16, kv_lora_rank=512, rope_dim=64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mlakit.reference_decode(
            batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
            kv_lora_rank=512, softmax_scale=batch.softmax_scale,
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_plan_on_the_local_gpu_reserves_workspaces():
    plan = mlakit.resolve(mlakit.ServingConfig(), mlakit.MLAShape.preset("deepseek-v3"))
    assert plan.device.local and plan.device.kind == "cuda"
    pool = mlakit.WorkspacePool()
    plan.reserve_workspaces(pool)
    for request in plan.workspaces:
        assert pool.nbytes(request.family, plan.device.torch_device) >= request.nbytes
