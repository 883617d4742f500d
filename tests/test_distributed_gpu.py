"""Decode context parallelism on a CUDA device (run on the device machine; skipped without CUDA):
two processes sharing one GPU over gloo, and NCCL (world size 1) inside a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dcp_worker import LAYOUTS, run_world
from mlakit import PagedLatentCache, mla_decode
from mlakit.distributed import TokenSharding, dcp_attention, dcp_decode_step
from mlakit.serving.graphs import capture_graph

pytestmark = pytest.mark.gpu


def test_two_processes_share_one_gpu_over_gloo(tmp_path) -> None:
    reports = run_world(2, tmp_path, "cuda", "triton")
    for rank, report in enumerate(reports):
        for tp, dcp in LAYOUTS[2]:
            for case, found in report.items():
                if case.startswith(f"tp{tp} dcp{dcp}: ") and "out_err" in found:
                    assert found["out_err"] <= found["out_tol"] and found["lse_err"] <= 1e-3, f"rank {rank} {case}: {found}"
                    assert found["slots_match_reserve"] and found["cache_holds_own_tokens"], f"rank {rank} {case}: {found}"


def test_dcp_decode_step_and_attention_capture_in_a_cuda_graph_over_nccl() -> None:
    """Metadata, the NCCL all-gather and all-to-all, the kernel and the merge in one graph; replayed
    with new lengths it matches eager runs and plain mla_decode."""
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        torch.manual_seed(0)
        cache = PagedLatentCache(64, 64, 512, 64, dtype="bf16", device="cuda")
        for seq, length in enumerate((300, 1, 77)):
            cache.append(seq, torch.randn(length, 512, device="cuda"), torch.randn(length, 64, device="cuda"))
        table = cache.block_table([0, 1, 2], max_pages=8)
        lens = cache.seq_lens([0, 1, 2])
        q = torch.randn(3 * 2, 16, 576, dtype=torch.bfloat16, device="cuda")  # q_len 2 (one draft token)
        scale = 192**-0.5

        def step_and_attend() -> torch.Tensor:
            step = dcp_decode_step(TokenSharding(1), 0, table, lens, q_len=2, page_size=64)
            out, _ = dcp_attention(q, cache.data, step, dist.group.WORLD, kv_lora_rank=512, softmax_scale=scale,
                                   backend="triton", check_inputs=False)
            return out

        eager = step_and_attend()  # compiles the kernels and starts the NCCL communicator outside capture
        plain, _ = mla_decode(q.view(3, 2, 16, 576), cache.data, table, lens, softmax_scale=scale, backend="triton")
        torch.testing.assert_close(eager, plain.flatten(0, 1), atol=2e-2, rtol=2e-2)
        graph, captured = capture_graph(step_and_attend, warmup=1)
        for extra in (0, 5):
            lens.copy_(torch.tensor([300 + extra, 1 + extra, 77 + extra], dtype=torch.int32))
            q.copy_(torch.randn_like(q))
            graph.replay()
            torch.testing.assert_close(captured, step_and_attend(), atol=1e-3, rtol=0)
    finally:
        dist.destroy_process_group()
