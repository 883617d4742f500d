"""Adapter for FlashMLA's dense decode (`flash_mla` package, SM90/SM100, page 64)."""

from __future__ import annotations

import torch

from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule

RECORD = BackendRecord(
    name="flashmla",
    summary="FlashMLA dense decode (deepseek-ai/FlashMLA): 64 query rows per CTA, SM-part scheduler",
    phases=frozenset({"decode"}),
    device_kinds=frozenset({"cuda"}),
    capability_majors=frozenset({9, 10}),
    page_sizes=PageSizeRule(sizes=frozenset({64})),
    kv_dtypes=frozenset({"bf16", "fp16"}),
    max_heads=128,
    kv_lora_ranks=frozenset({512}),
    rope_dims=frozenset({64}),
    packages=("flash_mla",),
    install_hint="pip install flash-mla (build from github.com/deepseek-ai/FlashMLA)",
    cuda_graphs=True,
    tree_drafts=False,  # its published decode takes no custom (tree) mask, only causal
    auto_rank=20,
    preferred_page_size=64,
    verified="H100: FlashMLA 9241ae3 built with scripts/build_flashmla.py; backend grid through mla_decode (1-128 heads, q_len 1-4, bf16/fp16)",
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
    metadata: tuple[object, object] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Calls `flash_mla_with_kvcache`; works with the classic metadata API and the newer one
    (whose `get_mla_metadata` returns a schedule object and no split counts)."""
    from flash_mla import flash_mla_with_kvcache

    _, q_len, heads, _ = q.shape
    k_cache = kv_cache if kv_cache.dim() == 4 else kv_cache.unsqueeze(2)
    schedule, num_splits = metadata or decode_metadata(cache_seqlens, q_len=q_len, heads=heads)
    out, lse = flash_mla_with_kvcache(
        q, k_cache, block_table, cache_seqlens, kv_lora_rank, schedule, num_splits,
        softmax_scale=softmax_scale, causal=True,
    )
    # FlashMLA writes lse = +inf for a query that sees no key; mlakit's convention is -inf.
    return out, lse.masked_fill(lse == float("inf"), float("-inf"))


def decode_metadata(cache_seqlens: torch.Tensor, *, q_len: int, heads: int, kv_cache_dtype: str = "bf16",
                    kv_tokens_hint: int | None = None, page_size: int | None = None) -> tuple[object, object]:
    """FlashMLA's tile schedule and split counts for the step (`get_mla_metadata`; its caches are 16-bit,
    so `kv_cache_dtype` changes nothing, its scheduler reads the lengths itself and its pages are 64 tokens:
    `kv_tokens_hint` and `page_size` are unused)."""
    from flash_mla import get_mla_metadata

    return get_mla_metadata(cache_seqlens, q_len * heads, 1)


register(RECORD, decode, decode_metadata=decode_metadata)
