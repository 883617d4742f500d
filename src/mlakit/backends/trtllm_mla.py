"""Adapter for FlashInfer's trtllm-gen MLA decode (SM100, page 32/64, bf16 or fp8)."""

from __future__ import annotations

import torch

from mlakit.backends.vendor_inputs import MIB, decode_workspace, pad_block_table, per_tensor_scale, query_for_cache
from mlakit.reference import pages_view
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule, WorkspaceSpec

# FlashInfer validates qk_nope_head_dim but the absorbed kernel never reads it; DeepSeek's value.
_QK_NOPE_HEAD_DIM = 128

RECORD = BackendRecord(
    name="trtllm_mla",
    summary="FlashInfer trtllm-gen MLA kernels (Blackwell)",
    phases=frozenset({"prefill", "decode"}),
    device_kinds=frozenset({"cuda"}),
    capability_majors=frozenset({10}),
    page_sizes=PageSizeRule(sizes=frozenset({32, 64})),
    kv_dtypes=frozenset({"bf16", "fp8_e4m3"}),
    max_heads=128,
    kv_lora_ranks=frozenset({512}),
    rope_dims=frozenset({64}),
    packages=("flashinfer",),
    install_hint="pip install flashinfer-python (with its trtllm-gen cubins)",
    cuda_graphs=True,
    tree_drafts=False,  # no tree mask in its published MLA decode; recorded conservatively
    returns_lse=False,
    auto_rank=10,
    preferred_page_size=64,
    workspace=WorkspaceSpec(
        family="trtllm_gen",
        formula="150 MiB, zero-filled once (holds the kernels' semaphores)",
        size_bytes=lambda _: 150 * MIB,
        zero_filled=True,
    ),
    verified="not run here: needs an SM100 GPU",
)


def trtllm_gen_decode(
    record: BackendRecord,
    kernel_backend: str,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
) -> torch.Tensor:
    """One call of `trtllm_batch_decode_with_kv_cache_mla` with FlashInfer's `backend` argument."""
    from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

    pages = pages_view(kv_cache)
    page_size = pages.shape[1]
    k_scale = per_tensor_scale(record.name, kv_cache, kv_scale)
    return trtllm_batch_decode_with_kv_cache_mla(
        query=query_for_cache(q, kv_cache),
        kv_cache=pages.unsqueeze(1),
        workspace_buffer=decode_workspace(record, q, kv_cache, block_table, kv_lora_rank),
        qk_nope_head_dim=_QK_NOPE_HEAD_DIM,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=q.shape[-1] - kv_lora_rank,
        block_tables=pad_block_table(block_table, page_size),
        seq_lens=cache_seqlens,
        max_seq_len=block_table.shape[1] * page_size,
        bmm1_scale=softmax_scale * k_scale,
        bmm2_scale=k_scale,
        backend=kernel_backend,
    )


def decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, None]:
    """trtllm-gen decode; returns no lse (the published kernel does not in every release)."""
    out = trtllm_gen_decode(RECORD, "trtllm-gen", q, kv_cache, block_table, cache_seqlens, kv_lora_rank, softmax_scale, kv_scale)
    return out, None


register(RECORD, decode)
