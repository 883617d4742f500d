"""The reference backend: exact torch attention on any device (slow; the oracle)."""

from __future__ import annotations

import torch

from mlakit.prefill.mha import mha_prefill_kernel, reference_attention_pass
from mlakit.reference import reference_decode, reference_extend
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule

RECORD = BackendRecord(
    name="reference",
    summary="exact torch implementation, fp32 math, any device; the oracle, not fast",
    phases=frozenset({"prefill", "decode"}),
    device_kinds=frozenset({"cpu", "cuda", "xpu"}),
    page_sizes=PageSizeRule(),
    kv_dtypes=frozenset({"bf16", "fp16", "fp8_e4m3"}),
    latent_extend=True,
    tree_drafts=False,  # its decode is causal over the draft tokens: chains only
    cuda_graphs=True,  # no host sync anywhere: capturable (slowly) on CUDA
    auto_rank=1000,
    preferred_page_size=64,
    verified="CPU (make test) and H100 (GPU tests)",
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
    """Reference decode with the output cast to the query's dtype and lse in float32."""
    out, lse = reference_decode(
        q, kv_cache, block_table, cache_seqlens, kv_lora_rank=kv_lora_rank, softmax_scale=softmax_scale, kv_scale=kv_scale
    )
    return out.to(q.dtype), lse


def extend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    max_q_len: int,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference extend with the output cast to the query's dtype and lse in float32."""
    out, lse = reference_extend(
        q, kv_cache, block_table, cache_seqlens, cu_seqlens_q,
        kv_lora_rank=kv_lora_rank, softmax_scale=softmax_scale, kv_scale=kv_scale,
    )
    return out.to(q.dtype), lse


prefill = mha_prefill_kernel(reference_attention_pass)

register(RECORD, decode, extend, prefill)
