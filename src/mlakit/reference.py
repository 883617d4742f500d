"""Exact torch MLA attention over a paged latent cache: the oracle every backend is tested against.

All functions work on any device, compute in float32 (or float64 on request), never
synchronise with the host, and read only the pages a query can see: block-table
entries past a sequence's visible pages are never dereferenced, and garbage (even
NaN) in unused pages or slots does not reach the result.
"""

from __future__ import annotations

import torch

from mlakit.cache.kv_quant import SCALE_PER_GROUP, dequantize, scale_mode

_GATHER_BUDGET_BYTES = 1 << 28


def pages_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """`[num_pages, page_size, dim]`, dropping FlashMLA's single-head axis if present."""
    return kv_cache.squeeze(2) if kv_cache.dim() == 4 else kv_cache


def reference_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention with `q_len` query tokens per sequence, causal inside the draft.

    Query token i of a sequence of length L sees keys `0 .. L - q_len + i`.
    Returns out `[batch, q_len, heads, kv_lora_rank]` and lse `[batch, heads, q_len]`
    (natural log), both in `compute_dtype`; a query that sees no key gives zeros and -inf.

    >>> q = torch.randn(1, 1, 2, 576)
    >>> cache = torch.randn(4, 16, 576)
    >>> out, lse = reference_decode(q, cache, torch.tensor([[2, 0]], dtype=torch.int32),
    ...     torch.tensor([20], dtype=torch.int32), kv_lora_rank=512, softmax_scale=0.07)
    >>> out.shape, lse.shape
    (torch.Size([1, 1, 2, 512]), torch.Size([1, 2, 1]))
    """
    batch, q_len, heads, dim = q.shape
    device = q.device
    token_seq = torch.arange(batch, device=device).repeat_interleave(q_len)
    draft_pos = torch.arange(q_len, device=device).repeat(batch)
    visible = cache_seqlens.long()[token_seq] - q_len + 1 + draft_pos
    out, lse = attend_tokens(
        q.reshape(batch * q_len, heads, dim),
        kv_cache,
        block_table,
        token_seq,
        visible,
        kv_lora_rank=kv_lora_rank,
        softmax_scale=softmax_scale,
        kv_scale=kv_scale,
        compute_dtype=compute_dtype,
    )
    return out.view(batch, q_len, heads, kv_lora_rank), lse.view(batch, q_len, heads).transpose(1, 2)


def e4m3_rounded_queries(q: torch.Tensor) -> torch.Tensor:
    """q as a kernel with e4m3 scores sees it, in float32 (`DecodePlan.e4m3_scores`): each row (last dim) scaled by the
    power of two that puts its largest magnitude in [128, 256), rounded to e4m3 (nearest, ties to even), scaled back.
    All-zero rows stay zero.

    >>> e4m3_rounded_queries(torch.tensor([[1.0, 0.1, 1000.0], [0.0, 0.0, 0.0]])).tolist()
    [[1.0, 0.1015625, 1024.0], [0.0, 0.0, 0.0]]
    """
    values = q.float()
    amax = values.abs().amax(dim=-1, keepdim=True)
    _, exponent = torch.frexp(amax)  # amax = m x 2^exponent, m in [0.5, 1): floor(log2 amax) = exponent - 1
    # 2^(7 - floor(log2 amax)) within 2^-113 .. 2^113: the kernels' E4M3_QUERY_EXPONENT and factor bounds (hopper_common).
    factor = torch.exp2((8 - exponent).clamp(-113, 113).float())
    return (values * factor).to(torch.float8_e4m3fn).float() / factor


def reference_extend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Extend/prefill: each sequence's new tokens attend to its cached prefix and causally to each other.

    The new tokens are already in the cache (written before attention, as engines do):
    sequence b holds `cache_seqlens[b]` tokens of which the last `n_b = cu_seqlens_q[b+1] -
    cu_seqlens_q[b]` are new, and new token i sees keys `0 .. cache_seqlens[b] - n_b + i`.
    q is packed `[total_new_tokens, heads, dim]`; returns out `[total_new_tokens, heads,
    kv_lora_rank]` and lse `[total_new_tokens, heads]`.

    >>> q = torch.randn(5, 2, 576)
    >>> out, lse = reference_extend(q, torch.randn(4, 16, 576), torch.tensor([[1], [3]], dtype=torch.int32),
    ...     torch.tensor([10, 3], dtype=torch.int32), torch.tensor([0, 2, 5], dtype=torch.int32),
    ...     kv_lora_rank=512, softmax_scale=0.07)
    >>> out.shape, lse.shape
    (torch.Size([5, 2, 512]), torch.Size([5, 2]))
    """
    total = q.shape[0]
    device = q.device
    starts = cu_seqlens_q.long()
    new_counts = starts[1:] - starts[:-1]
    token_seq = torch.arange(new_counts.numel(), device=device).repeat_interleave(new_counts, output_size=total)
    pos_in_new = torch.arange(total, device=device) - starts[token_seq]
    visible = cache_seqlens.long()[token_seq] - new_counts[token_seq] + 1 + pos_in_new
    return attend_tokens(
        q,
        kv_cache,
        block_table,
        token_seq,
        visible,
        kv_lora_rank=kv_lora_rank,
        softmax_scale=softmax_scale,
        kv_scale=kv_scale,
        compute_dtype=compute_dtype,
    )


def attend_tokens(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    token_seq: torch.Tensor,
    visible: torch.Tensor,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent attention for query tokens `[n, heads, dim]`, token t seeing the first `visible[t]`
    keys of sequence `token_seq[t]`. Returns out `[n, heads, kv_lora_rank]`, lse `[n, heads]`.

    >>> out, lse = attend_tokens(torch.randn(1, 1, 8), torch.randn(1, 4, 8), torch.zeros(1, 1, dtype=torch.int32),
    ...     torch.tensor([0]), torch.tensor([0]), kv_lora_rank=6, softmax_scale=1.0)
    >>> out.abs().sum().item(), lse.item()
    (0.0, -inf)
    """
    pages = pages_view(kv_cache)
    _, page_size, dim = pages.shape
    num_tokens, heads, _ = q.shape
    max_pages = block_table.shape[1]
    span = max_pages * page_size
    visible = visible.clamp(min=0, max=span)
    per_group_scale = scale_mode(pages, kv_scale) == SCALE_PER_GROUP
    row_bytes = span * dim * torch.finfo(compute_dtype).bits // 8
    chunk = max(1, _GATHER_BUDGET_BYTES // max(row_bytes, 1))

    out = torch.empty(num_tokens, heads, kv_lora_rank, dtype=compute_dtype, device=q.device)
    lse = torch.empty(num_tokens, heads, dtype=compute_dtype, device=q.device)
    page_ids = torch.arange(max_pages, device=q.device)
    token_ids = torch.arange(span, device=q.device)
    for start in range(0, num_tokens, chunk):
        stop = min(start + chunk, num_tokens)
        vis = visible[start:stop]
        page_used = page_ids[None, :] * page_size < vis[:, None]
        table = torch.where(page_used, block_table[token_seq[start:stop]].long(), 0)
        scale = kv_scale[table] if per_group_scale else kv_scale
        rows = dequantize(pages[table], scale, compute_dtype).reshape(stop - start, span, dim)
        key_used = token_ids[None, :] < vis[:, None]
        rows = torch.where(key_used[..., None], rows, 0)
        scores = torch.einsum("nhd,ntd->nht", q[start:stop].to(compute_dtype), rows) * softmax_scale
        scores = scores.masked_fill(~key_used[:, None, :], float("-inf"))
        chunk_lse = torch.logsumexp(scores, dim=-1)
        finite_lse = torch.where(torch.isfinite(chunk_lse), chunk_lse, 0)
        probs = torch.exp(scores - finite_lse[..., None])
        out[start:stop] = torch.einsum("nht,ntd->nhd", probs, rows[..., :kv_lora_rank])
        lse[start:stop] = chunk_lse
    return out, lse


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merges two partial attention results over disjoint key sets by their log-sum-exps.

    `lse_*` has the shape of `out_*` without its last axis. An empty part (lse = -inf)
    contributes nothing; two empty parts give zeros and -inf, never NaN.

    >>> o, l = merge_attention_states(torch.ones(1, 2), torch.tensor([0.0]),
    ...     torch.zeros(1, 2), torch.tensor([float("-inf")]))
    >>> o.tolist(), l.tolist()
    ([[1.0, 1.0]], [0.0])
    """
    lse = torch.logaddexp(lse_a, lse_b)
    finite = torch.isfinite(lse)
    safe_lse = torch.where(finite, lse, 0)
    weight_a = torch.where(finite, torch.exp(lse_a - safe_lse), 0)[..., None]
    weight_b = torch.where(finite, torch.exp(lse_b - safe_lse), 0)[..., None]
    return out_a * weight_a + out_b * weight_b, lse
