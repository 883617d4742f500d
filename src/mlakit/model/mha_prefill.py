"""Prefill in MHA form: decompress K/V per head, causal attention over the new tokens, the cached
prefix in bounded chunks, merged by lse. Torch implementation (any device, float32 math)."""

from __future__ import annotations

import torch

from mlakit.kv_quant import SCALE_PER_GROUP, dequantize, scale_mode
from mlakit.reference import merge_attention_states, pages_view

DEFAULT_PREFIX_CHUNK_TOKENS = 4096


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


def decompress(latent: torch.Tensor, k_pe: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head keys `[m, H, dn + dr]` and values `[m, H, dv]` from latent rows `[m, r]` and `k_pe [m, dr]`."""
    k_nope = torch.einsum("mr,hdr->mhd", latent, w_uk)
    keys = torch.cat([k_nope, k_pe[:, None, :].expand(-1, w_uk.shape[0], -1)], dim=-1)
    return keys, torch.einsum("mr,hdr->mhd", latent, w_uv)


def mha_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    new_tokens: tuple[int, ...],
    cache_lens: tuple[int, ...],
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    *,
    softmax_scale: float,
    kv_scale: torch.Tensor | None = None,
    prefix_chunk_tokens: int = DEFAULT_PREFIX_CHUNK_TOKENS,
) -> torch.Tensor:
    """MHA-form attention for packed new tokens `q [T, H, dn + dr]` whose rows are already in the cache.

    `w_uk [H, dn, r]` and `w_uv [H, dv, r]` decompress the latent. Each sequence's cached
    prefix is read in chunks of at most `prefix_chunk_tokens` tokens, so memory stays bounded
    whatever the prefix length. Returns `[T, H, dv]` in float32.
    """
    pages = pages_view(kv_cache)
    kv_lora_rank = w_uk.shape[-1]
    w_uk, w_uv = w_uk.float(), w_uv.float()
    outputs = []
    start = 0
    for b, (new, total) in enumerate(zip(new_tokens, cache_lens)):
        q_b = q[start : start + new].float()
        start += new
        if new == 0:
            continue
        prefix = total - new
        new_rows = _sequence_rows(pages, block_table[b], kv_scale, prefix, total)
        keys, values = decompress(new_rows[:, :kv_lora_rank], new_rows[:, kv_lora_rank:], w_uk, w_uv)
        out, lse = attend_heads(q_b, keys, values, softmax_scale, causal=True)
        for first in range(0, prefix, prefix_chunk_tokens):
            chunk = _sequence_rows(pages, block_table[b], kv_scale, first, min(first + prefix_chunk_tokens, prefix))
            keys, values = decompress(chunk[:, :kv_lora_rank], chunk[:, kv_lora_rank:], w_uk, w_uv)
            out, lse = merge_attention_states(out, lse, *attend_heads(q_b, keys, values, softmax_scale, causal=False))
        outputs.append(out)
    return torch.cat(outputs) if outputs else q.new_zeros(0, q.shape[1], w_uv.shape[1], dtype=torch.float32)


def _sequence_rows(
    pages: torch.Tensor, page_table: torch.Tensor, kv_scale: torch.Tensor | None, first: int, last: int
) -> torch.Tensor:
    """float32 rows of tokens `first .. last - 1` of one sequence, gathered through its page table."""
    page_size, dim = pages.shape[1], pages.shape[2]
    positions = torch.arange(first, last, device=pages.device)
    flat = page_table[positions // page_size].long() * page_size + positions % page_size
    per_group = scale_mode(pages, kv_scale) == SCALE_PER_GROUP
    scale = kv_scale.view(-1, kv_scale.shape[-1])[flat] if per_group else kv_scale
    return dequantize(pages.view(-1, dim)[flat], scale)
