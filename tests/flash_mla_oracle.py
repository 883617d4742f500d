"""Shared by the compat.flash_mla tests: FlashMLA's conventions as a float64 oracle, and one call."""

from __future__ import annotations

import torch

from mlakit.compat.flash_mla import FlashMLASchedule, flash_mla_with_kvcache, get_mla_metadata
from paged_inputs import PagedBatch, assert_lse_close, naive_attention, relative_error, sequence_keys

LENGTHS = [70, 0, 1, 129, 5]


def oracle(batch: PagedBatch, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 out `[b, s_q, h_q, r]` and lse `[b, h_q, s_q]` with FlashMLA's conventions: with
    `causal` and s_q > 1 token i sees keys 0 .. L - s_q + i, else all L; +inf lse for no keys."""
    b, s_q, heads, _ = batch.q.shape
    out = torch.zeros(b, s_q, heads, batch.kv_lora_rank, dtype=torch.float64)
    lse = torch.zeros(b, heads, s_q, dtype=torch.float64)
    for seq in range(b):
        keys = sequence_keys(batch, seq)
        for i in range(s_q):
            visible = max(0, keys.shape[0] - s_q + i + 1) if causal else keys.shape[0]
            out[seq, i], lse[seq, :, i] = naive_attention(batch.q[seq, i].cpu(), keys[:visible], batch.kv_lora_rank, batch.softmax_scale)
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def run(batch: PagedBatch, schedule: tuple[FlashMLASchedule, None] | None = None, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    schedule = schedule or get_mla_metadata()
    return flash_mla_with_kvcache(
        batch.q, batch.kv_cache.unsqueeze(2), batch.block_table, batch.cache_seqlens, batch.kv_lora_rank, *schedule,
        softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, is_fp8_kvcache=batch.kv_scale is not None, **kwargs,
    )


def assert_matches_oracle(batch: PagedBatch, out: torch.Tensor, lse: torch.Tensor, causal: bool) -> None:
    expected_out, expected_lse = oracle(batch, causal)
    assert out.shape == expected_out.shape and out.dtype == batch.q.dtype
    assert out.device == lse.device == batch.q.device
    assert lse.shape == expected_lse.shape and lse.dtype == torch.float32  # FlashMLA's own lse is a strided view
    fp8 = batch.kv_scale is not None
    assert relative_error(out, expected_out) < (3e-2 if fp8 else 1e-2)
    out, lse, infinite = out.float().cpu(), lse.cpu(), torch.isposinf(expected_lse)
    assert torch.equal(torch.isposinf(lse), infinite), "lse: +inf (query without keys) positions differ"
    assert not out[infinite.transpose(1, 2)].any(), "a query without keys must give zeros"
    assert_lse_close(lse.masked_fill(infinite, 0), expected_lse.masked_fill(infinite, 0), atol=3e-2 if fp8 else 1e-3)
