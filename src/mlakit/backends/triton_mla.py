"""The `triton` backend: mlakit's own Triton kernels (decode, latent extend, MHA-form prefill)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mlakit.cache.kv_quant import STORAGE_DTYPES
from mlakit.prefill.mha import mha_prefill_kernel
from mlakit.prefill.metadata import Segments
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule

if TYPE_CHECKING:
    from mlakit.kernels.triton_decode import DecodePlan, PreparedCall

RECORD = BackendRecord(
    name="triton",
    summary="mlakit's portable Triton kernels: split-KV decode, latent extend, MHA prefill (any page size, heads, q_len; fp8 with scales)",
    phases=frozenset({"prefill", "decode"}),
    device_kinds=frozenset({"cuda"}),
    capability_majors=frozenset({8, 9, 10, 12}),
    kv_dtype_min_capability=(("fp8_e4m3", (8, 9)),),
    page_sizes=PageSizeRule(),
    kv_dtypes=frozenset({"bf16", "fp16", "fp8_e4m3"}),
    packages=("triton",),
    install_hint="pip install triton",
    cuda_graphs=True,
    latent_extend=True,
    tree_drafts=False,  # the decode kernel is causal over the draft tokens: chains only
    auto_rank=60,
    preferred_page_size=64,
    cpu_interpreter=True,
    verified="CPU interpreter (make test) and H100 (GPU tests)",
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
    metadata: DecodePlan | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    e4m3_scores: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV kernels plus their lse combine (`metadata`: the step's split plan; without one, a plan with
    `e4m3_scores`, `DecodePlan`'s)."""
    from mlakit.kernels.triton_decode import triton_mla_decode

    return triton_mla_decode(
        q, kv_cache, block_table, cache_seqlens, kv_lora_rank=kv_lora_rank, softmax_scale=softmax_scale, kv_scale=kv_scale,
        plan=metadata, out=out, lse=lse, e4m3_scores=e4m3_scores,
    )


def decode_metadata(cache_seqlens: torch.Tensor, *, q_len: int, heads: int, kv_cache_dtype: str,
                    kv_tokens_hint: int | None = None, page_size: int | None = None,
                    e4m3_scores: bool = False) -> DecodePlan:
    """The step's split plan, computed on the GPU from the lengths (`e4m3_scores`: `DecodePlan`'s; `kv_tokens_hint`
    and `page_size`: `plan_decode`'s)."""
    from mlakit.kernels.triton_decode import plan_decode

    return plan_decode(cache_seqlens, q_len=q_len, heads=heads, kv_dtype=STORAGE_DTYPES[kv_cache_dtype],
                       e4m3_scores=e4m3_scores, kv_tokens_hint=kv_tokens_hint, page_size=page_size)


def prepare_call(metadata: DecodePlan, *args: object, **kwargs: object) -> PreparedCall | None:
    """The step's decode or extend prepared for one input layout (`triton_decode.prepare_call`, same arguments)."""
    from mlakit.kernels import triton_decode

    return triton_decode.prepare_call(metadata, *args, **kwargs)


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
    metadata: DecodePlan | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    e4m3_scores: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same split kernels over ragged query segments (`metadata`: the step's split plan; without one, a plan
    with `e4m3_scores`)."""
    from mlakit.kernels.triton_decode import triton_mla_extend

    return triton_mla_extend(
        q, kv_cache, block_table, cache_seqlens, cu_seqlens_q,
        max_q_len=max_q_len, kv_lora_rank=kv_lora_rank, softmax_scale=softmax_scale, kv_scale=kv_scale,
        plan=metadata, out=out, lse=lse, e4m3_scores=e4m3_scores,
    )


def extend_metadata(
    cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, *, max_q_len: int, heads: int, kv_cache_dtype: str,
    kv_tokens_hint: int | None = None, page_size: int | None = None, e4m3_scores: bool = False,
) -> DecodePlan:
    """The step's split plan over its ragged segments, computed on the GPU from the lengths (`e4m3_scores`:
    `DecodePlan`'s; `kv_tokens_hint` and `page_size`: `plan_decode`'s)."""
    from mlakit.kernels.triton_decode import plan_extend

    return plan_extend(cache_seqlens, cu_seqlens_q, max_q_len=max_q_len, heads=heads,
                       kv_dtype=STORAGE_DTYPES[kv_cache_dtype], e4m3_scores=e4m3_scores, kv_tokens_hint=kv_tokens_hint,
                       page_size=page_size)


def _attention_pass(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    queries: Segments,
    keys: Segments,
    *,
    causal: bool,
    softmax_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
    merge: bool,
) -> None:
    from mlakit.kernels.triton_prefill import triton_mha_prefill

    triton_mha_prefill(
        q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens,
        max_q_len=queries.max_len, causal=causal, softmax_scale=softmax_scale, out=out, lse=lse, merge=merge,
        max_k_len=keys.max_len,
    )


def decompress_rows(*args: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`prefill.prepared.decompress_rows` (the fused gather-decompress where it serves the cache), imported on use."""
    from mlakit.prefill.prepared import decompress_rows

    return decompress_rows(*args)


def prepare_prefill(*args: object) -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """The step's prefill prepared for one input layout (`prefill.prepared.prepare_prefill`, same arguments)."""
    from mlakit.prefill.prepared import prepare_prefill as prepare

    return prepare(*args)


prefill = mha_prefill_kernel(_attention_pass, decompress_rows)

register(RECORD, decode, extend, prefill, decode_metadata, extend_metadata, writes_outputs=True,
         prepare_call=prepare_call, prepare_prefill=prepare_prefill)
