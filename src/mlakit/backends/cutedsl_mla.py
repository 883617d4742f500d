"""Adapter for FlashInfer's cute-dsl MLA decode (SM100, decode only; prefill via trtllm_mla)."""

from __future__ import annotations

import torch

from mlakit.backends.trtllm_mla import trtllm_gen_decode
from mlakit.backends.vendor_inputs import MIB
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule, WorkspaceSpec

RECORD = BackendRecord(
    name="cutedsl_mla",
    summary="FlashInfer cute-dsl MLA decode (Blackwell); prefill falls back to trtllm_mla",
    phases=frozenset({"decode"}),
    device_kinds=frozenset({"cuda"}),
    capability_majors=frozenset({10}),
    page_sizes=PageSizeRule(sizes=frozenset({32, 64})),
    kv_dtypes=frozenset({"bf16", "fp8_e4m3"}),
    max_decode_q_len=1,
    tree_drafts=False,  # no speculative decoding at all
    max_heads=128,
    kv_lora_ranks=frozenset({512}),
    rope_dims=frozenset({64}),
    packages=("flashinfer", "cutlass"),
    install_hint="pip install flashinfer-python nvidia-cutlass-dsl",
    cuda_graphs=True,
    returns_lse=False,
    prefill_fallback="trtllm_mla",
    auto_rank=30,
    preferred_page_size=64,
    # Its own family: cute-dsl writes split-KV partials over the whole buffer, which would
    # destroy the zeroed semaphores trtllm-gen keeps in its workspace.
    workspace=WorkspaceSpec(
        family="cutedsl",
        formula="150 MiB scratch (split-KV partials: batch x heads x q_len x splits x (kv_lora_rank + 1) x 4)",
        size_bytes=lambda _: 150 * MIB,
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
    """cute-dsl decode through FlashInfer's trtllm MLA entry point with backend="cute-dsl"."""
    out = trtllm_gen_decode(RECORD, "cute-dsl", q, kv_cache, block_table, cache_seqlens, kv_lora_rank, softmax_scale, kv_scale)
    return out, None


register(RECORD, decode)
