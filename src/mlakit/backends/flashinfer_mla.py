"""Adapter for FlashInfer's BatchMLAPagedAttentionWrapper (SM80+, any page size)."""

from __future__ import annotations

import math

import torch

from mlakit.backends.vendor_inputs import MIB, decode_workspace
from mlakit.reference import pages_view
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule, WorkspaceSpec

RECORD = BackendRecord(
    name="flashinfer_mla",
    summary="FlashInfer BatchMLAPagedAttentionWrapper (fa2/fa3): any page size, prefill and decode",
    phases=frozenset({"prefill", "decode"}),
    device_kinds=frozenset({"cuda"}),
    capability_majors=frozenset({8, 9, 10, 12}),
    page_sizes=PageSizeRule(),
    kv_dtypes=frozenset({"bf16", "fp16"}),
    max_heads=128,
    kv_lora_ranks=frozenset({512}),
    rope_dims=frozenset({64}),
    packages=("flashinfer",),
    install_hint="pip install flashinfer-python",
    cuda_graphs=True,
    tree_drafts=False,  # not through the MLA decode mlakit calls; recorded conservatively
    auto_rank=50,
    preferred_page_size=64,
    workspace=WorkspaceSpec(family="flashinfer_float", formula="128 MiB float workspace", size_bytes=lambda _: 128 * MIB),
    verified="H100: FlashInfer 0.7.2.post1 (fa3); backend grid through mla_decode (16-128 heads, q_len 1-2, pages 1/16/64)",
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plans and runs one decode; FlashInfer's base-2 lse is converted to natural log.

    `plan()` copies index arrays to the host, so this eager path syncs once per call.
    """
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    batch, q_len, heads, _ = q.shape
    pages = pages_view(kv_cache)
    page_size = pages.shape[1]
    device = q.device
    pages_used = (cache_seqlens.long() + page_size - 1) // page_size
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.cumsum(pages_used, 0).to(torch.int32)
    in_use = torch.arange(block_table.shape[1], device=device)[None, :] < pages_used[:, None]
    kv_indices = block_table[in_use].to(torch.int32)
    qo_indptr = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=device)

    wrapper = BatchMLAPagedAttentionWrapper(decode_workspace(RECORD, q, kv_cache, block_table, kv_lora_rank))
    wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, cache_seqlens, heads, kv_lora_rank, q.shape[-1] - kv_lora_rank,
        page_size, True, softmax_scale, q.dtype, pages.dtype,
    )
    flat_q = q.reshape(batch * q_len, heads, -1)
    out, lse_base2 = wrapper.run(
        flat_q[..., :kv_lora_rank], flat_q[..., kv_lora_rank:],
        pages[..., :kv_lora_rank], pages[..., kv_lora_rank:], return_lse=True,
    )
    lse = (lse_base2 * math.log(2.0)).view(batch, q_len, heads).transpose(1, 2)
    return out.view(batch, q_len, heads, kv_lora_rank), lse


register(RECORD, decode)
