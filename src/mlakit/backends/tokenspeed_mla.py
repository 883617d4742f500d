"""Adapter for the tokenspeed_mla kernels (SM100, fp8 KV only, page 32/64, q_len <= 8)."""

from __future__ import annotations

import torch

from mlakit.backends.vendor_inputs import decode_workspace, per_tensor_scale, query_for_cache
from mlakit.reference import pages_view
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule, WorkspaceInputs, WorkspaceSpec

MAX_Q_LEN = 8


def _workspace_bytes(inputs: WorkspaceInputs) -> int:
    sms = inputs.device.num_sms or 148
    return sms * inputs.shape.num_heads * MAX_Q_LEN * (inputs.shape.kv_lora_rank + 1) * 4


RECORD = BackendRecord(
    name="tokenspeed_mla",
    summary="tokenspeed_mla kernels (Blackwell, fp8 KV)",
    phases=frozenset({"prefill", "decode"}),
    device_kinds=frozenset({"cuda"}),
    capability_majors=frozenset({10}),
    page_sizes=PageSizeRule(sizes=frozenset({32, 64})),
    kv_dtypes=frozenset({"fp8_e4m3"}),
    max_decode_q_len=MAX_Q_LEN,
    max_heads=128,
    kv_lora_ranks=frozenset({512}),
    rope_dims=frozenset({64}),
    packages=("tokenspeed_mla",),
    install_hint="pip install tokenspeed-mla",
    cuda_graphs=True,
    tree_drafts=False,  # no tree mask documented; recorded conservatively
    returns_lse=False,
    auto_rank=40,
    preferred_page_size=64,
    workspace=WorkspaceSpec(
        family="tokenspeed",
        formula="SMs x heads_per_rank x 8 x (kv_lora_rank + 1) x 4 bytes",
        size_bytes=_workspace_bytes,
    ),
    verified="not run here: needs an SM100 GPU",
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
    """`tokenspeed_mla_decode` on the fp8 cache (query cast to fp8, the cache scale folded in)."""
    import tokenspeed_mla

    pages = pages_view(kv_cache)
    k_scale = per_tensor_scale(RECORD.name, kv_cache, kv_scale)
    out = tokenspeed_mla.tokenspeed_mla_decode(
        query_for_cache(q, kv_cache),
        pages,
        decode_workspace(RECORD, q, kv_cache, block_table, kv_lora_rank),
        kv_lora_rank,
        q.shape[-1] - kv_lora_rank,
        block_table,
        cache_seqlens,
        block_table.shape[1] * pages.shape[1],
        softmax_scale * k_scale,
        output_scale=k_scale,
    )
    return out, None


register(RECORD, decode)
