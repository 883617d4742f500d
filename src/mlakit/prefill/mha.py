"""Prefill in MHA form, shared by every backend that runs it: gather each pass's latent rows
from the pages, decompress them through `kv_b_proj`'s weight into per-head keys and values,
attend (the backend's kernel), merge the passes by lse.

The decompressed keys are never concatenated with the shared rope key: attention kernels
take `k_nope [rows, H, d_nope]`, `k_pe [rows, d_rope]` and `v [rows, H, d_v]` (the last two
halves of one GEMM output) separately.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from mlakit.cache.kv_quant import SCALE_PER_GROUP, dequantize, scale_mode
from mlakit.prefill.metadata import PrefillMetadata, Segments
from mlakit.reference import merge_attention_states, pages_view

if TYPE_CHECKING:
    from mlakit.registry.catalog import PrefillKernel


class AttentionPass(Protocol):
    """Varlen attention of query segments over key segments (shapes as in `triton_mha_prefill`),
    written into `out [T, H, d_v]` and `lse [T, H]`, or merged by lse into what they hold."""

    def __call__(
        self,
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
    ) -> None: ...


def gather_rows(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows `[len(slots), kv_lora_rank + rope]` at flat `slots`, dequantized to `dtype`."""
    pages = pages_view(kv_cache)
    rows = pages.reshape(-1, pages.shape[-1]).index_select(0, slots)
    if kv_scale is None:
        return rows.to(dtype)
    per_group = scale_mode(pages, kv_scale) == SCALE_PER_GROUP
    scale = kv_scale.reshape(-1, kv_scale.shape[-1]).index_select(0, slots) if per_group else kv_scale
    return dequantize(rows, scale).to(dtype)


def decompress(
    rows: torch.Tensor, kv_b_weight: torch.Tensor, heads: int, nope_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head `k_nope [m, H, d_nope]`, shared `k_pe [m, d_rope]` and `v [m, H, d_v]` from latent rows
    `[m, kv_lora_rank + d_rope]`, through `kv_b_weight [H * (d_nope + d_v), kv_lora_rank]` (one GEMM).

    >>> k_nope, k_pe, v = decompress(torch.randn(3, 10), torch.randn(2 * (4 + 5), 8), heads=2, nope_dim=4)
    >>> k_nope.shape, k_pe.shape, v.shape
    (torch.Size([3, 2, 4]), torch.Size([3, 2]), torch.Size([3, 2, 5]))
    """
    rank = kv_b_weight.shape[1]
    return split_heads(rows[:, :rank] @ kv_b_weight.to(rows.dtype).t(), rows, rank, heads, nope_dim)


def split_heads(product: torch.Tensor, rows: torch.Tensor, rank: int, heads: int,
                nope_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`decompress`'s views: `k_nope` and `v` of the GEMM's `product [m, H * (d_nope + d_v)]` and the
    latent `rows`' rope columns past `rank` as `k_pe`.

    >>> k_nope, k_pe, v = split_heads(torch.zeros(3, 18), torch.zeros(3, 10), rank=8, heads=2, nope_dim=4)
    >>> k_nope.shape, k_pe.shape, v.shape
    (torch.Size([3, 2, 4]), torch.Size([3, 2]), torch.Size([3, 2, 5]))
    """
    per_head = product.view(rows.shape[0], heads, product.shape[1] // heads)
    return per_head[..., :nope_dim], rows[:, rank:], per_head[..., nope_dim:]


def head_dims(q: torch.Tensor, row_width: int, kv_b_weight: torch.Tensor) -> tuple[int, int]:
    """d_nope and d_v of a prefill: q `[T, H, d_nope + d_rope]` over cache rows `row_width = kv_lora_rank +
    d_rope` wide, decompressed through `kv_b_weight [H * (d_nope + d_v), kv_lora_rank]`.

    >>> head_dims(torch.zeros(5, 2, 192), 576, torch.zeros(2 * 256, 512))
    (128, 128)
    """
    nope_dim = q.shape[2] - (row_width - kv_b_weight.shape[1])
    return nope_dim, kv_b_weight.shape[0] // q.shape[1] - nope_dim


def gather_and_decompress(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, slots: torch.Tensor,
                          kv_b_weight: torch.Tensor, heads: int, nope_dim: int,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`decompress(gather_rows(...))`: one pass's keys and values in torch (any cache format)."""
    return decompress(gather_rows(kv_cache, kv_scale, slots, dtype), kv_b_weight, heads, nope_dim)


class RowDecompressor(Protocol):
    """One pass's `k_nope`, `k_pe` and `v` (in `dtype`) from the cache rows at `slots` (`gather_and_decompress`'s shapes)."""

    def __call__(self, kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, slots: torch.Tensor,
                 kv_b_weight: torch.Tensor, heads: int, nope_dim: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


# A chunked prefill merges each prefix chunk into a running output held in q's 16-bit dtype while no sequence's rows
# meet more chunks than this (one rounding a merge, as one piece rounds once; at 4 merges 1.2x the one-piece error:
# benchmarks/NOTES.md p27), else in float32, converted once at the end (the conversion and the wider rows cost ~5% of
# a chunked 8 x 2048-token prefill).
MAX_16BIT_MERGES = 4


def running_dtype(meta: PrefillMetadata, dtype: torch.dtype) -> torch.dtype:
    """The dtype a prefill of `meta` keeps its running output in, for q of `dtype`.

    >>> from mlakit.prefill.metadata import plan_prefill
    >>> table = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    >>> four, five = (plan_prefill([1], [1 + 2 * n], table, 4, prefix_chunk_tokens=2) for n in (4, 5))
    >>> (four.merges_per_row, running_dtype(four, torch.bfloat16)), (five.merges_per_row, running_dtype(five, torch.bfloat16))
    ((4, torch.bfloat16), (5, torch.float32))
    """
    return dtype if meta.merges_per_row <= MAX_16BIT_MERGES else torch.float32


def run_mha_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_b_weight: torch.Tensor,
    meta: PrefillMetadata,
    *,
    attend: AttentionPass,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
    decompress_rows: RowDecompressor = gather_and_decompress,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The passes of `meta` (causal over the new tokens, non-causal over prefix chunks) on `attend`,
    each chunk merged into the running result. Returns out `[T, H, d_v]` in q's dtype and lse
    `[T, H]` float32. A backend's prefill kernel is this with its `attend` (and `decompress_rows`)
    bound (`mha_prefill_kernel`)."""
    heads = q.shape[1]
    nope_dim, v_dim = head_dims(q, pages_view(kv_cache).shape[-1], kv_b_weight)
    out = torch.empty(q.shape[0], heads, v_dim, dtype=running_dtype(meta, q.dtype), device=q.device)
    lse = torch.empty(q.shape[0], heads, dtype=torch.float32, device=q.device)
    for index, (keys, causal) in enumerate(meta.passes):
        k_nope, k_pe, v = decompress_rows(kv_cache, kv_scale, keys.slots, kv_b_weight, heads, nope_dim, q.dtype)
        attend(q, k_nope, k_pe, v, meta.queries, keys.segments, causal=causal, softmax_scale=softmax_scale,
               out=out, lse=lse, merge=index > 0)
    return out.to(q.dtype), lse


def mha_prefill_kernel(attend: AttentionPass, decompress_rows: RowDecompressor = gather_and_decompress) -> PrefillKernel:
    """The registry's prefill entry point (`mlakit.mla_prefill`'s shapes) running `run_mha_prefill` on
    `attend` and `decompress_rows`.

    >>> mha_prefill_kernel(reference_attention_pass).__name__
    'prefill'
    """

    def prefill(
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        kv_b_weight: torch.Tensor,
        meta: PrefillMetadata,
        *,
        softmax_scale: float,
        kv_scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return run_mha_prefill(q, kv_cache, kv_b_weight, meta, attend=attend, softmax_scale=softmax_scale,
                               kv_scale=kv_scale, decompress_rows=decompress_rows)

    return prefill


def reference_attention_pass(
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
    """The torch oracle of an attention pass: float32 math, one segment at a time (host offsets)."""
    heads = q.shape[1]
    q_first = k_first = 0
    for q_len, k_len in zip(queries.lens, keys.lens):
        q_rows, k_rows = slice(q_first, q_first + q_len), slice(k_first, k_first + k_len)
        q_first, k_first = q_first + q_len, k_first + k_len
        if q_len == 0 or (merge and k_len == 0):
            continue
        k = torch.cat([k_nope[k_rows], k_pe[k_rows, None, :].expand(-1, heads, -1)], dim=-1).float()
        part_out, part_lse = attend_heads(q[q_rows].float(), k, v[k_rows].float(), softmax_scale, causal)
        if merge:
            part_out, part_lse = merge_attention_states(out[q_rows].float(), lse[q_rows], part_out, part_lse)
        out[q_rows], lse[q_rows] = part_out.to(out.dtype), part_lse


def attend_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `q [n, H, dk]` over `k [m, H, dk]`, `v [m, H, dv]`; with `causal`, query i
    sees keys `0 .. i + m - n`. Returns out `[n, H, dv]` and lse `[n, H]` (zeros / -inf when empty).

    >>> out, lse = attend_heads(torch.randn(2, 1, 4), torch.randn(0, 1, 4), torch.randn(0, 1, 3), 0.5, False)
    >>> out.abs().sum().item(), lse.tolist()
    (0.0, [[-inf], [-inf]])
    """
    scores = torch.einsum("nhd,mhd->hnm", q, k) * softmax_scale
    if causal:
        n, m = q.shape[0], k.shape[0]
        visible = torch.arange(m, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (m - n)
        scores = scores.masked_fill(~visible[None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    return torch.einsum("hnm,mhd->nhd", probs, v), lse.transpose(0, 1)
