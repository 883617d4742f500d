"""MHA-form prefill: the Triton varlen kernel against the float32 oracle, `mla_prefill` against the
latent form it must equal, prefix chunking and its metadata, fp8 caches, and the input checks.

Runs on the CPU under the Triton interpreter (small shapes) and on the GPU when there is one.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mlakit
from mlakit.backends import triton_mla
from mlakit.attention.checks import check_prefill_inputs
from mlakit.errors import ConfigError, MLAInputError
from mlakit.kernels import triton_prefill
from mlakit.kernels.triton_prefill import PrefillTuning, triton_mha_prefill
from mlakit.prefill.mha import attend_heads, reference_attention_pass
from mlakit.prefill.metadata import PrefillMetadata, Segments, plan_prefill
from mlakit.reference import reference_extend
from paged_inputs import PagedBatch, assert_lse_close, make_paged_batch, relative_error

OUT_RTOL = 1e-2
LSE_ATOL = 1e-3
FP8_TOL = 3e-2


def _segments(lens: list[int], device: str) -> Segments:
    offsets = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0)
    return Segments(tuple(lens), offsets.to(torch.int32).to(device))


def _oracle_pass(q, k_nope, k_pe, v, queries, keys, *, causal, softmax_scale):
    """reference_attention_pass into fresh float32 buffers: (out, lse)."""
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    reference_attention_pass(q, k_nope, k_pe, v, queries, keys, causal=causal, softmax_scale=softmax_scale,
                             out=out, lse=lse, merge=False)
    return out, lse


def _assert_matches(out, lse, expected_out, expected_lse, *, out_tol=OUT_RTOL, lse_tol=LSE_ATOL):
    assert torch.isfinite(out.float()).all(), "non-finite output (NaN from unused pages or padding leaked in?)"
    error = relative_error(out, expected_out)
    assert error <= out_tol, f"output relative error {error:.3g} > {out_tol}"
    assert_lse_close(lse, expected_lse, atol=lse_tol)


# ---------------------------------------------------------------------------------------------
# The attention kernel alone: triton_mha_prefill vs reference_attention_pass (float32).
# ---------------------------------------------------------------------------------------------


def _kernel_inputs(q_lens, k_lens, heads, d_nope, d_rope, d_v, dtype, *, seed, device, layout="halves", pad_rows=3):
    """Packed q and keys with `pad_rows` NaN rows after the last segment (never to be read).
    layout "halves": k_nope and v are the two halves of one `[Tk, H, d_nope + d_v]` tensor and
    k_pe a column slice of `[Tk, 40 + d_rope]` latent rows (as decompress produces them);
    "contiguous": three separate contiguous tensors; "q_view": like halves, with q a slice too."""
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(q_lens) + pad_rows, sum(k_lens) + pad_rows
    q_full = torch.randn(tq, heads, d_nope + d_rope + 8, generator=gen)
    kv = torch.randn(tk, heads, d_nope + d_v, generator=gen)
    latent = torch.randn(tk, 40 + d_rope, generator=gen)
    for t in (q_full, kv, latent):
        t[t.shape[0] - pad_rows:] = float("nan")
    q_full, kv, latent = (t.to(dtype).to(device) for t in (q_full, kv, latent))
    q = q_full[..., : d_nope + d_rope] if layout == "q_view" else q_full[..., : d_nope + d_rope].contiguous()
    k_nope, v, k_pe = kv[..., :d_nope], kv[..., d_nope:], latent[:, 40:]
    if layout == "contiguous":
        k_nope, v, k_pe = k_nope.contiguous(), v.contiguous(), k_pe.contiguous()
    elif tk:
        assert not k_nope.is_contiguous() and not v.is_contiguous() and not k_pe.is_contiguous()
    return q, k_nope, k_pe, v


KERNEL_CASES = [
    # q_lens, k_lens, heads, d_nope, d_rope, d_v, causal, layout
    ([5, 0, 17, 3], [5, 4, 17, 0], 3, 16, 16, 16, True, "halves"),  # empty query and empty key segments
    ([20, 6], [6, 6], 1, 16, 16, 16, True, "halves"),  # q_len > k_len: 14 rows see no key
    ([40, 7, 1], [25, 30, 64], 5, 16, 16, 16, True, "halves"),  # q_len > k_len across several row tiles
    ([33, 1, 0, 12], [50, 0, 9, 12], 3, 16, 16, 16, False, "halves"),
    ([9, 16, 31], [40, 16, 31], 5, 24, 8, 20, True, "halves"),  # non-power-of-two head dims
    ([12, 0, 19], [3, 33, 0], 1, 24, 8, 20, False, "contiguous"),
    ([17, 4], [49, 4], 3, 16, 16, 16, True, "q_view"),
    ([18, 16, 2], [32, 31, 17], 3, 16, 16, 16, True, "halves"),  # k_len - q_len = 14, 15: diagonal tile edges
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("q_lens, k_lens, heads, d_nope, d_rope, d_v, causal, layout", KERNEL_CASES)
def test_kernel_matches_float32_oracle(q_lens, k_lens, heads, d_nope, d_rope, d_v, causal, layout, dtype, kernel_device):
    seed = sum(q_lens) * 7 + sum(k_lens) + heads + (dtype == torch.float16)
    q, k_nope, k_pe, v = _kernel_inputs(q_lens, k_lens, heads, d_nope, d_rope, d_v, dtype, seed=seed, device=kernel_device, layout=layout)
    queries, keys = _segments(q_lens, kernel_device), _segments(k_lens, kernel_device)
    scale = (d_nope + d_rope) ** -0.5
    out, lse = triton_mha_prefill(
        q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=queries.max_len, causal=causal, softmax_scale=scale
    )
    rows = sum(q_lens)
    assert out.shape == (q.shape[0], heads, d_v) and out.dtype == dtype
    assert lse.shape == (q.shape[0], heads) and lse.dtype == torch.float32
    out, lse = out[:rows], lse[:rows]
    expected_out, expected_lse = _oracle_pass(
        q.float(), k_nope.float(), k_pe.float(), v.float(), queries, keys, causal=causal, softmax_scale=scale
    )
    assert expected_out.dtype == torch.float32
    _assert_matches(out, lse, expected_out[:rows], expected_lse[:rows])

    # Rows that see no key at all: exactly zeros and -inf (and there must be some in the cases meant to have them).
    blind = torch.isneginf(expected_lse[:rows].cpu())
    if (causal and any(n > m for n, m in zip(q_lens, k_lens))) or any(n and not m for n, m in zip(q_lens, k_lens)):
        assert blind.any()
    assert torch.equal(out.cpu()[blind], torch.zeros_like(out.cpu()[blind]))


def test_calls_of_one_layout_plan_once(kernel_device, monkeypatch):
    """A layer's call after the first plans nothing (new tensors of the same layout, new values, right results, an
    `out` given at another 16-byte-aligned address); any operand's layout changed plans again: a longer query segment,
    keys in separate tensors (other strides), an `out` one element off 16-byte alignment."""
    planned = []
    plan = triton_prefill.plan_attention
    monkeypatch.setattr(triton_prefill, "plan_attention", lambda *args, **kwargs: planned.append(1) or plan(*args, **kwargs))
    keys = _segments([9, 7], kernel_device)

    def call(q_lens, seed, layout="halves", out_offset=None):
        q, k_nope, k_pe, v = _kernel_inputs(q_lens, [9, 7], 3, 16, 16, 16, torch.bfloat16, seed=seed,
                                            device=kernel_device, layout=layout)
        queries = _segments(q_lens, kernel_device)
        out = None
        if out_offset is not None:
            buffer = torch.empty(q.shape[0] * 3 * 16 + out_offset, dtype=torch.bfloat16, device=kernel_device)
            out = buffer[out_offset:].view(q.shape[0], 3, 16)
        got_out, got_lse = triton_mha_prefill(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens,
                                              max_q_len=queries.max_len, causal=True, softmax_scale=0.2, out=out)
        expected_out, expected_lse = _oracle_pass(q.float(), k_nope.float(), k_pe.float(), v.float(), queries, keys,
                                                  causal=True, softmax_scale=0.2)
        rows = sum(q_lens)
        _assert_matches(got_out[:rows], got_lse[:rows], expected_out[:rows], expected_lse[:rows])
        return len(planned)

    assert [call([5, 7], 1), call([5, 7], 2), call([5, 7], 3, out_offset=8)] == [1, 1, 1]
    assert call([6, 7], 4) == 2
    assert call([6, 7], 5, layout="contiguous") == 3
    assert call([6, 7], 6, out_offset=1) == 4


@pytest.mark.parametrize("block_m, block_n", [(32, 16), (16, 32)])
def test_kernel_tile_shapes_agree(block_m, block_n, kernel_device):
    q_lens, k_lens = [37, 3, 0], [70, 3, 5]
    q, k_nope, k_pe, v = _kernel_inputs(q_lens, k_lens, 3, 16, 16, 16, torch.bfloat16, seed=block_m + block_n, device=kernel_device)
    queries, keys = _segments(q_lens, kernel_device), _segments(k_lens, kernel_device)
    rows = sum(q_lens)
    for causal in (True, False):
        out, lse = triton_mha_prefill(
            q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=queries.max_len, causal=causal,
            softmax_scale=0.2, tuning=PrefillTuning(block_m=block_m, block_n=block_n, num_warps=4, num_stages=1),
        )
        expected_out, expected_lse = _oracle_pass(
            q.float(), k_nope.float(), k_pe.float(), v.float(), queries, keys, causal=causal, softmax_scale=0.2
        )
        _assert_matches(out[:rows], lse[:rows], expected_out[:rows], expected_lse[:rows])


@pytest.mark.parametrize("causal_first", [True, False])
def test_kernel_merges_a_second_key_set_into_the_first(causal_first, kernel_device):
    """Attending to keys A (causal or not), then merging keys B (no mask) equals one pass over B + A, and
    the rows of a segment without B keys are left exactly as they were."""
    q_lens, a_lens, b_lens = [9, 4, 6], [9, 7, 6], [20, 0, 3]
    heads, d_nope, d_rope, d_v = 3, 16, 8, 16
    q, a_nope, a_pe, a_v = _kernel_inputs(q_lens, a_lens, heads, d_nope, d_rope, d_v, torch.bfloat16, seed=5, device=kernel_device)
    _, b_nope, b_pe, b_v = _kernel_inputs(q_lens, b_lens, heads, d_nope, d_rope, d_v, torch.bfloat16, seed=6, device=kernel_device)
    queries = _segments(q_lens, kernel_device)
    kwargs = dict(max_q_len=queries.max_len, softmax_scale=0.25)
    out = torch.empty(sum(q_lens) + 3, heads, d_v, dtype=torch.float32, device=kernel_device)
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=kernel_device)
    a_keys, b_keys = _segments(a_lens, kernel_device), _segments(b_lens, kernel_device)
    triton_mha_prefill(q, a_nope, a_pe, a_v, queries.cu_seqlens, a_keys.cu_seqlens, causal=causal_first, out=out, lse=lse, **kwargs)
    before = out.clone()
    triton_mha_prefill(q, b_nope, b_pe, b_v, queries.cu_seqlens, b_keys.cu_seqlens, causal=False, out=out, lse=lse, merge=True, **kwargs)

    rows = sum(q_lens)
    untouched = slice(q_lens[0], q_lens[0] + q_lens[1])  # sequence 1 has no B keys
    assert torch.equal(out[untouched], before[untouched])
    expected_out, expected_lse = torch.empty_like(out[:rows]), torch.empty_like(lse[:rows])
    first = k_a = k_b = 0
    for n, m_a, m_b in zip(q_lens, a_lens, b_lens):
        q_rows = slice(first, first + n)
        keys = torch.cat([
            torch.cat([b_nope[k_b:k_b + m_b], b_pe[k_b:k_b + m_b, None].expand(-1, heads, -1)], -1),
            torch.cat([a_nope[k_a:k_a + m_a], a_pe[k_a:k_a + m_a, None].expand(-1, heads, -1)], -1),
        ]).float()
        values = torch.cat([b_v[k_b:k_b + m_b], a_v[k_a:k_a + m_a]]).float()
        # causal over A only: query i sees all of B and A's keys 0 .. i + m_a - n
        scores = torch.einsum("nhd,mhd->hnm", q[q_rows].float(), keys) * 0.25
        if causal_first:
            visible_a = torch.arange(m_a, device=kernel_device)[None, :] <= torch.arange(n, device=kernel_device)[:, None] + m_a - n
            visible = torch.cat([torch.ones(n, m_b, dtype=torch.bool, device=kernel_device), visible_a], dim=1)
            scores = scores.masked_fill(~visible[None], float("-inf"))
        expected_lse[q_rows] = torch.logsumexp(scores, -1).transpose(0, 1)
        expected_out[q_rows] = torch.einsum("hnm,mhd->nhd", torch.softmax(scores, -1), values)
        first, k_a, k_b = first + n, k_a + m_a, k_b + m_b
    _assert_matches(out[:rows], lse[:rows], expected_out, expected_lse)


def test_kernel_with_no_query_tokens_or_no_keys(kernel_device):
    q, k_nope, k_pe, v = _kernel_inputs([0, 0], [4, 0], 2, 16, 16, 16, torch.bfloat16, seed=1, device=kernel_device, pad_rows=0)
    queries, keys = _segments([0, 0], kernel_device), _segments([4, 0], kernel_device)
    out, lse = triton_mha_prefill(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=0, causal=True, softmax_scale=0.3)
    assert out.shape == (0, 2, 16) and lse.shape == (0, 2)

    q, k_nope, k_pe, v = _kernel_inputs([2, 3], [0, 0], 2, 16, 16, 16, torch.float16, seed=2, device=kernel_device, pad_rows=0)
    queries, keys = _segments([2, 3], kernel_device), _segments([0, 0], kernel_device)
    for causal in (True, False):
        out, lse = triton_mha_prefill(
            q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=3, causal=causal, softmax_scale=0.3
        )
        assert torch.equal(out.cpu(), torch.zeros(5, 2, 16, dtype=torch.float16))
        assert torch.isneginf(lse).all()


def test_oracle_pass_matches_a_per_query_loop():
    """reference_attention_pass / attend_heads against a float64 loop over queries written without masks."""
    gen = torch.Generator().manual_seed(11)
    q_lens, k_lens, heads, d_nope, d_rope, d_v = [3, 6, 0, 2], [7, 4, 3, 0], 3, 12, 4, 5
    q = torch.randn(sum(q_lens), heads, d_nope + d_rope, generator=gen)
    k_nope = torch.randn(sum(k_lens), heads, d_nope, generator=gen)
    k_pe = torch.randn(sum(k_lens), d_rope, generator=gen)
    v = torch.randn(sum(k_lens), heads, d_v, generator=gen)
    queries, keys = _segments(q_lens, "cpu"), _segments(k_lens, "cpu")
    for causal in (True, False):
        out, lse = _oracle_pass(q, k_nope, k_pe, v, queries, keys, causal=causal, softmax_scale=0.3)
        q0 = k0 = 0
        for n, m in zip(q_lens, k_lens):
            for i in range(n):
                seen = max(0, min(m, i + m - n + 1)) if causal else m
                for h in range(heads):
                    keys_h = torch.cat([k_nope[k0:k0 + seen, h], k_pe[k0:k0 + seen]], dim=-1).double()
                    if seen == 0:
                        assert lse[q0 + i, h] == float("-inf") and out[q0 + i, h].abs().sum() == 0
                        continue
                    scores = keys_h @ q[q0 + i, h].double() * 0.3
                    expected = torch.softmax(scores, 0) @ v[k0:k0 + seen, h].double()
                    assert torch.allclose(out[q0 + i, h].double(), expected, atol=1e-5)
                    assert abs(lse[q0 + i, h].item() - torch.logsumexp(scores, 0).item()) < 1e-5
            q0, k0 = q0 + n, k0 + m
    # attend_heads: bottom-right causal alignment on one segment with more queries than keys.
    out, lse = attend_heads(q[:4].double(), torch.randn(2, heads, d_nope + d_rope, dtype=torch.float64, generator=gen),
                            torch.randn(2, heads, d_v, dtype=torch.float64, generator=gen), 0.3, True)
    assert torch.isneginf(lse[:2]).all() and torch.isfinite(lse[2:]).all()
    assert (out[:2] == 0).all()


# ---------------------------------------------------------------------------------------------
# mla_prefill vs the latent form on a paged cache.
# ---------------------------------------------------------------------------------------------


class Problem:
    """A paged batch with `prefixes[b] + new[b]` tokens per sequence (shuffled pages, NaN in unused
    pages and slots, garbage page indices after each sequence's pages), packed queries of the new
    tokens and a random `kv_b_proj` weight.

    The MHA form stores the decompressed keys and values in q's dtype, one rounding the latent
    form does not make. With `exact_decompression` (16-bit caches), latent values are random
    multiples of 1/2 in [-4, 4] and weights random +-1/8, so every decompressed entry is a
    multiple of 1/16 of magnitude at most 16 (kv_lora_rank <= 32): exact in bf16 and fp16, and the two forms must agree
    to float32 accuracy. Without it, values and weights are Gaussian."""

    def __init__(self, prefixes, new, *, heads, page_size, d_nope=16, d_v=16, kv_lora_rank=32, rope_dim=16,
                 q_dtype=torch.bfloat16, w_dtype=None, kv_dtype=None, scale_layout="tensor", exact_decompression=True,
                 seed=0, device="cpu"):
        self.prefixes, self.new = list(prefixes), list(new)
        self.lens = [p + n for p, n in zip(prefixes, new)]
        self.heads, self.d_nope, self.d_v, self.rank, self.rope = heads, d_nope, d_v, kv_lora_rank, rope_dim
        kv_dtype = kv_dtype or ("fp16" if q_dtype == torch.float16 else "bf16")
        self.batch: PagedBatch = make_paged_batch(
            self.lens, heads=heads, page_size=page_size, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim, kv_dtype=kv_dtype,
            scale_layout=scale_layout, q_dtype=q_dtype, seed=seed, device=device,
        )
        gen = torch.Generator().manual_seed(seed + 1000)
        self.q = torch.randn(sum(new), heads, d_nope + rope_dim, generator=gen).to(q_dtype).to(device)
        if exact_decompression:
            cache = self.batch.kv_cache
            assert cache.dtype in (torch.bfloat16, torch.float16) and kv_lora_rank <= 32
            self.batch.kv_cache = ((cache.float() * 2).round() / 2).clamp(-4, 4).to(cache.dtype)  # NaN stays NaN
            weight = (torch.randint(0, 2, (heads * (d_nope + d_v), kv_lora_rank), generator=gen) * 2 - 1) / 8
        else:
            weight = torch.randn(heads * (d_nope + d_v), kv_lora_rank, generator=gen) / kv_lora_rank**0.5
        self.weight = weight.to(w_dtype or q_dtype).to(device)
        self.scale = (d_nope + rope_dim) ** -0.5
        self.page_size, self.device = page_size, device
        self.unit_roundoff = torch.finfo(q_dtype).eps / 2

    def plan(self, prefix_chunk_tokens: int | None = None, heads: int | None = None) -> PrefillMetadata:
        kwargs = {} if prefix_chunk_tokens is None else {"prefix_chunk_tokens": prefix_chunk_tokens}
        return plan_prefill(self.new, self.lens, self.batch.block_table, self.page_size, heads=heads, **kwargs)

    def run(self, backend: str, meta: PrefillMetadata | None = None, kv_cache=None):
        meta = meta or self.plan()
        kv_cache = self.batch.kv_cache if kv_cache is None else kv_cache
        args = (self.q, kv_cache, self.weight, meta)
        kwargs = dict(softmax_scale=self.scale, kv_scale=self.batch.kv_scale)
        if backend == "triton" and self.q.device.type != "cuda":
            # The triton backend is registered for CUDA only: on the CPU interpreter run its prefill
            # entry point directly, after the same input checks mla_prefill makes.
            check_prefill_inputs(self.q, kv_cache, self.weight, meta, self.batch.kv_scale)
            out, lse = triton_mla.prefill(*args, **kwargs)
        else:
            out, lse = mlakit.mla_prefill(*args, backend=backend, **kwargs)
        assert out.shape == (sum(self.new), self.heads, self.d_v) and out.dtype == self.q.dtype
        assert lse.shape == (sum(self.new), self.heads) and lse.dtype == torch.float32
        return out, lse

    def latent_form(self) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 absorbed-weight attention: q_latent_h = [q_nope_h @ W_UK_h ; q_pe] over the
        dequantized latent cache (reference_extend), then each head's output through W_UV_h."""
        w = self.weight.double().cpu().view(self.heads, self.d_nope + self.d_v, self.rank)
        w_uk, w_uv = w[:, : self.d_nope], w[:, self.d_nope:]
        q = self.q.double().cpu()
        q_latent = torch.cat([torch.einsum("thn,hnr->thr", q[..., : self.d_nope], w_uk), q[..., self.d_nope:]], dim=-1)
        cu = torch.tensor([0, *self.new], dtype=torch.int64).cumsum(0).to(torch.int32)
        out_latent, lse = reference_extend(
            q_latent, self.batch.dequantized_cache().cpu(), self.batch.block_table.cpu(), self.batch.cache_seqlens.cpu(), cu,
            kv_lora_rank=self.rank, softmax_scale=self.scale, compute_dtype=torch.float64,
        )
        return torch.einsum("thr,hvr->thv", out_latent, w_uv), lse

    def score_rounding_bound(self) -> float:
        """The most any score can move when k_nope is stored in q's dtype (relative error <= u per
        entry): u * scale * max over (token, head, key of its sequence) of sum_d |q_nope_d| |k_nope_d|.
        The lse moves by at most as much as the largest score."""
        w = self.weight.double().cpu().view(self.heads, self.d_nope + self.d_v, self.rank)[:, : self.d_nope]
        cache = self.batch.dequantized_cache().cpu()
        table, page_size = self.batch.block_table.cpu(), self.page_size
        q_nope = self.q[..., : self.d_nope].double().abs().cpu()
        worst, first = 0.0, 0
        for b, (length, count) in enumerate(zip(self.lens, self.new)):
            if count:
                rows = torch.stack([cache[int(table[b, t // page_size]), t % page_size, : self.rank] for t in range(length)])
                k_nope = torch.einsum("mr,hnr->mhn", rows, w).abs()
                worst = max(worst, torch.einsum("thn,mhn->thm", q_nope[first:first + count], k_nope).max().item())
            first += count
        return self.unit_roundoff * self.scale * worst


BACKENDS = ["triton", "reference"]

LATENT_CASES = [
    # prefixes, new tokens, heads, page_size, d_nope, d_v, rope_dim, w_dtype
    ([0, 0], [5, 9], 3, 16, 16, 16, 16, None),  # no prefix
    ([60, 0, 13], [6, 4, 0], 5, 1, 16, 16, 16, None),  # 60 shuffled one-token pages; a sequence with no new tokens
    ([40, 25, 0], [12, 0, 3], 1, 16, 24, 20, 8, None),  # odd dims
    ([29, 3], [17, 1], 3, 4, 16, 16, 16, torch.float32),  # page size 4, float32 weight
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("prefixes, new, heads, page_size, d_nope, d_v, rope_dim, w_dtype", LATENT_CASES)
def test_mla_prefill_equals_latent_form(prefixes, new, heads, page_size, d_nope, d_v, rope_dim, w_dtype, q_dtype, backend, kernel_device):
    problem = Problem(
        prefixes, new, heads=heads, page_size=page_size, d_nope=d_nope, d_v=d_v, rope_dim=rope_dim, q_dtype=q_dtype,
        w_dtype=w_dtype, seed=sum(prefixes) + 3 * sum(new) + heads, device=kernel_device,
    )
    out, lse = problem.run(backend)
    expected_out, expected_lse = problem.latent_form()
    assert torch.isfinite(lse).all(), "every new token sees at least itself"
    _assert_matches(out, lse, expected_out, expected_lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gaussian_data_matches_latent_form_up_to_key_rounding(q_dtype, backend, kernel_device):
    problem = Problem([37, 0, 11], [9, 6, 4], heads=5, page_size=16, q_dtype=q_dtype, exact_decompression=False,
                      seed=40 + (q_dtype == torch.float16), device=kernel_device)
    out, lse = problem.run(backend)
    expected_out, expected_lse = problem.latent_form()
    bound = problem.score_rounding_bound()
    assert bound < 0.1, "the bound should be meaningful"
    _assert_matches(out, lse, expected_out, expected_lse, lse_tol=bound + 1e-4)


def test_mla_prefill_accepts_a_cache_with_a_head_axis(kernel_device):
    problem = Problem([21, 4], [7, 2], heads=2, page_size=8, seed=3, device=kernel_device)
    out, lse = problem.run("triton", kv_cache=problem.batch.kv_cache.unsqueeze(2))
    _assert_matches(out, lse, *problem.latent_form())


@pytest.mark.parametrize("chunk, heads", [(1, None), (7, None), (16, None), (64, None), (7, 3)])
def test_chunked_prefix_equals_unchunked(chunk, heads, kernel_device):
    problem = Problem([41, 0, 9, 30], [5, 3, 0, 11], heads=3, page_size=4, seed=chunk, device=kernel_device)
    whole, whole_lse = problem.run("triton", problem.plan(10**9))
    meta = problem.plan(chunk, heads=heads)
    read = sum(p for p, n in zip(problem.prefixes, problem.new) if n)  # a sequence without new tokens reads nothing
    assert len(meta.prefix_chunks) == (-(-read // chunk) if chunk < read else 0)
    out, lse = problem.run("triton", meta)
    _assert_matches(out, lse, whole.float(), whole_lse)
    _assert_matches(out, lse, *problem.latent_form())
    if chunk == 7:  # the reference backend runs the same chunked passes
        ref, ref_lse = problem.run("reference", problem.plan(chunk))
        _assert_matches(ref, ref_lse, *problem.latent_form())


def _expected_slots(table: torch.Tensor, page_size: int, b: int, first: int, stop: int) -> list[int]:
    return [int(table[b, t // page_size]) * page_size + t % page_size for t in range(first, stop)]


@pytest.mark.parametrize("heads, shared", [(16, 2), (8, 4), (4, 8), (128, 1)])
def test_prefix_chunks_are_shared_so_that_a_pass_fills_its_last_wave(heads, shared):
    """8 sequences of 512 new tokens (4 row blocks each) over 4096-token prefixes in 8192-token chunks, planned off a
    GPU (132 SMs): the fewest sequences a chunk whose pass fills its last wave of programs to 90%: 16 heads, two (128
    programs; one would fill 48%, three 73%); 8 heads, four (128); 4 heads, eight (128; seven would fill 85%);
    128 heads, one (512 programs, 3.9 waves; its chunk then takes the next whole prefix too)."""
    table = torch.arange(8 * 72, dtype=torch.int32).view(8, 72)
    meta = plan_prefill([512] * 8, [4608] * 8, table, 64, heads=heads)
    per_sequence = 8192 // max(shared, 2)
    assert {n for chunk in meta.prefix_chunks for n in chunk.segments.lens if n} == {per_sequence}
    assert meta.merges_per_row == 4096 // per_sequence


@pytest.mark.parametrize("chunk", [1, 7, 64, 112, 10**9])  # 112: exactly the prefixes' total, which fits one chunk
@pytest.mark.parametrize("page_size", [1, 16, 5])
@pytest.mark.parametrize("heads", [None, 1, 128])  # 1 head: every sequence shares each chunk; 128: one at a time
def test_prefix_chunk_metadata_covers_every_row_once(chunk, page_size, heads):
    prefixes, new = [37, 0, 70, 5, 0], [4, 9, 2, 1, 0]
    assert sum(prefixes) == 112
    lens = [p + n for p, n in zip(prefixes, new)]
    batch = make_paged_batch(lens, heads=1, page_size=page_size, seed=page_size)
    table = batch.block_table
    meta = plan_prefill(new, lens, table, page_size, prefix_chunk_tokens=chunk, heads=heads)
    assert meta.page_size == page_size
    assert meta.queries.lens == tuple(new)
    assert meta.queries.cu_seqlens.tolist() == torch.tensor([0, *new]).cumsum(0).tolist()

    def check_segments(rows):
        assert rows.slots.dtype == torch.int64 and rows.slots.numel() == rows.segments.total
        assert rows.segments.cu_seqlens.dtype == torch.int32
        assert rows.segments.cu_seqlens.tolist() == torch.tensor([0, *rows.segments.lens]).cumsum(0).tolist()

    check_segments(meta.causal_keys)
    causal = meta.causal_keys
    if sum(prefixes) <= chunk:
        assert meta.prefix_chunks == ()
        assert causal.starts == (0,) * len(lens) and causal.segments.lens == tuple(lens)
        expected = [s for b in range(len(lens)) for s in _expected_slots(table, page_size, b, 0, lens[b])]
        assert causal.slots.tolist() == expected
        return
    assert causal.starts == tuple(prefixes) and causal.segments.lens == tuple(new)
    expected_new = [s for b in range(len(lens)) for s in _expected_slots(table, page_size, b, prefixes[b], lens[b])]
    assert causal.slots.tolist() == expected_new

    seen = [[] for _ in lens]
    for i, part in enumerate(meta.prefix_chunks):
        check_segments(part)
        total = part.segments.total
        assert 0 < total <= chunk
        if i < len(meta.prefix_chunks) - 1:
            assert total == chunk, "prefixes are laid end to end and cut every prefix_chunk_tokens rows"
        slots = part.slots.tolist()
        for b, (start, length) in enumerate(zip(part.starts, part.segments.lens)):
            assert start == len(seen[b]), "each chunk continues where the previous one stopped"
            first = int(part.segments.cu_seqlens[b])
            seen[b].extend(slots[first:first + length])
    for b in range(len(lens)):
        assert seen[b] == _expected_slots(table, page_size, b, 0, prefixes[b]), f"sequence {b}: prefix rows not covered exactly once"
    all_slots = [s for rows in seen for s in rows] + expected_new
    assert len(set(all_slots)) == len(all_slots) == sum(lens)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prefixes, chunk", [([0, 0], None), ([20, 9], 5)])
def test_step_without_new_tokens_returns_empty(prefixes, chunk, backend, kernel_device):
    """A step in which no sequence has new tokens: the causal pass reads no rows at all."""
    problem = Problem(prefixes, [0, 0], heads=2, page_size=4, seed=2, device=kernel_device)
    out, lse = problem.run(backend, problem.plan(chunk))
    assert out.shape == (0, 2, 16) and lse.shape == (0, 2)


# ---------------------------------------------------------------------------------------------
# fp8 caches.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale_layout", ["tensor", "group"])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_cache_matches_latent_form_on_dequantized_cache(scale_layout, q_dtype, backend, kernel_device):
    problem = Problem(
        [31, 0, 12], [6, 5, 2], heads=3, page_size=8, kv_dtype="fp8_e4m3", scale_layout=scale_layout, q_dtype=q_dtype,
        exact_decompression=False, seed=17 + (scale_layout == "group"), device=kernel_device,
    )
    assert problem.batch.kv_cache.dtype == torch.float8_e4m3fn
    expected_out, expected_lse = problem.latent_form()
    for meta in (problem.plan(), problem.plan(prefix_chunk_tokens=16)):
        out, lse = problem.run(backend, meta)
        _assert_matches(out, lse, expected_out, expected_lse, out_tol=FP8_TOL, lse_tol=FP8_TOL)


# ---------------------------------------------------------------------------------------------
# Input checks.
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def small_problem():
    return Problem([10, 3], [4, 2], heads=3, page_size=4, seed=5)


def _call(problem, *, q=None, kv_cache=None, weight=None, meta=None, kv_scale=None, backend="reference"):
    return mlakit.mla_prefill(
        problem.q if q is None else q,
        problem.batch.kv_cache if kv_cache is None else kv_cache,
        problem.weight if weight is None else weight,
        problem.plan() if meta is None else meta,
        softmax_scale=problem.scale,
        kv_scale=kv_scale,
        backend=backend,
    )


def test_valid_call_passes_the_checks(small_problem):
    out, _ = _call(small_problem)
    assert torch.isfinite(out.float()).all()


def test_rejects_q_with_wrong_token_count(small_problem):
    with pytest.raises(MLAInputError, match=r"^q: .*6 tokens"):
        _call(small_problem, q=small_problem.q[:-1])


def test_rejects_float64_q(small_problem):
    with pytest.raises(MLAInputError, match=r"^q: .*float64"):
        _call(small_problem, q=small_problem.q.double())


def test_rejects_cache_with_another_page_size(small_problem):
    cache = small_problem.batch.kv_cache
    other = cache.reshape(cache.shape[0] * 2, cache.shape[1] // 2, cache.shape[2])
    with pytest.raises(MLAInputError, match=r"^kv_cache: .*pages of 4 tokens"):
        _call(small_problem, kv_cache=other)


def test_rejects_weight_rows_not_divisible_by_heads(small_problem):
    weight = torch.cat([small_problem.weight, small_problem.weight[:1]])
    with pytest.raises(MLAInputError, match=r"^kv_b_weight: "):
        _call(small_problem, weight=weight)


@pytest.mark.parametrize("bad_page", [-1, "num_pages"])
def test_rejects_out_of_range_page_index(small_problem, bad_page):
    table = small_problem.batch.block_table.clone()
    num_pages = small_problem.batch.kv_cache.shape[0]
    table[1, 0] = num_pages if bad_page == "num_pages" else bad_page
    meta = plan_prefill(small_problem.new, small_problem.lens, table, small_problem.page_size)
    with pytest.raises(MLAInputError, match=r"^block_table: .*out of range"):
        _call(small_problem, meta=meta)


def test_plan_rejects_cache_longer_than_its_pages():
    table = torch.zeros(2, 3, dtype=torch.int32)
    plan_prefill([2, 1], [12, 1], table, 4)  # exactly 3 pages of 4: fine
    with pytest.raises(MLAInputError, match=r"^cache_lens\[0\]: "):
        plan_prefill([2, 1], [13, 1], table, 4)


def test_plan_rejects_more_new_tokens_than_cached():
    table = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(MLAInputError, match=r"sequence 1: .*new_tokens <= cache_lens"):
        plan_prefill([2, 5], [12, 4], table, 4)


def test_flashmla_is_refused_as_decode_only(small_problem):
    with pytest.raises(ConfigError, match=r"flashmla.*prefill") as info:
        _call(small_problem, backend="flashmla")
    assert "decode only" in str(info.value)


def test_rejects_fp8_cache_without_scale():
    problem = Problem([6], [2], heads=2, page_size=4, kv_dtype="fp8_e4m3", exact_decompression=False, seed=4)
    _call(problem, kv_scale=problem.batch.kv_scale)
    with pytest.raises(MLAInputError, match=r"^kv_scale: "):
        _call(problem)


def test_plan_skips_the_prefix_of_a_sequence_without_new_tokens_and_refuses_bad_heads():
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    meta = plan_prefill([0, 5], [100, 5], table, 16, prefix_chunk_tokens=10, heads=16)
    assert meta.prefix_chunks == () and meta.causal_keys.segments.lens == (0, 5)
    with pytest.raises(MLAInputError, match="heads: expected >= 1"):
        plan_prefill([2, 5], [100, 5], table, 16, heads=0)


def test_kernel_refuses_out_and_lse_it_cannot_write(kernel_device):
    q, k_nope, k_pe, v = _kernel_inputs([3], [3], 2, 16, 16, 16, torch.bfloat16, seed=3, device=kernel_device, pad_rows=0)
    cu = _segments([3], kernel_device).cu_seqlens
    run = dict(max_q_len=3, causal=True, softmax_scale=0.3)
    with pytest.raises(MLAInputError, match="out: expected shape"):
        triton_mha_prefill(q, k_nope, k_pe, v, cu, cu, out=torch.empty(3, 16, 2, device=kernel_device).transpose(1, 2), **run)
    with pytest.raises(MLAInputError, match="lse: expected float32"):
        triton_mha_prefill(q, k_nope, k_pe, v, cu, cu, lse=torch.empty(2, 3, device=kernel_device).t(), **run)


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), min_size=1, max_size=6),
    chunk=st.integers(1, 50),
    heads=st.one_of(st.none(), st.integers(1, 128)),
)
def test_prefix_chunks_cover_what_the_queries_read_once_in_full_chunks(lens, chunk, heads):
    prefixes, new = [p for p, _ in lens], [n for _, n in lens]
    totals = [p + n for p, n in lens]
    table = torch.randperm(6 * 12).view(6, 12)[: len(lens)].int()
    meta = plan_prefill(new, totals, table, 4, prefix_chunk_tokens=chunk, heads=heads)
    read = [p if n else 0 for p, n in zip(prefixes, new)]
    if sum(read) <= chunk:
        assert meta.prefix_chunks == ()
        return
    seen = [0] * len(lens)
    for i, part in enumerate(meta.prefix_chunks):
        assert 0 < part.segments.total <= chunk
        if i < len(meta.prefix_chunks) - 1:
            assert part.segments.total == chunk
        for b, (start, length) in enumerate(zip(part.starts, part.segments.lens)):
            if length:
                assert start == seen[b]
            seen[b] += length
    assert seen == read


@pytest.mark.parametrize("kwargs, message", [
    (dict(kernel="cudnn"), "PrefillTuning.kernel: expected one of ('portable', 'hopper', 'hopper_persistent'), got 'cudnn'"),
    (dict(kernel="hopper", block_m=64), "PrefillTuning: the hopper kernel runs block_m 128 on num_warps 4"),
    (dict(kernel="hopper_persistent", num_warps=8), "the hopper_persistent kernel runs block_m 128 on num_warps 4"),
    (dict(kernel="hopper_persistent", num_stages=1), "with block_n 64 or 128 and 2 <= num_stages <= 3"),
    (dict(kernel="hopper_persistent", num_stages=4), "with block_n 64 or 128 and 2 <= num_stages <= 3"),
    (dict(kernel="hopper", num_warps=8), "PrefillTuning: the hopper kernel runs block_m 128 on num_warps 4"),
    (dict(kernel="hopper", num_stages=1), "with block_n 64 or 128 and 2 <= num_stages <= 3"),
    (dict(kernel="hopper", block_n=32), "with block_n 64 or 128 and 2 <= num_stages <= 3"),
    (dict(num_stages=0), "PrefillTuning.num_stages: expected >= 1, got 0"),
])
def test_prefill_tuning_refuses_what_no_kernel_runs(kwargs, message):
    fields = dict(block_m=128, block_n=64, num_warps=4, num_stages=2) | kwargs
    with pytest.raises(MLAInputError, match=re.escape(message)):
        PrefillTuning(**fields)


@pytest.mark.parametrize("row_blocks, heads, segments, head_mib, sms", [
    (64, 128, 1, 4, 132), (3, 5, 3, 0.01, 132), (1, 1, 1, 1000, 132), (16, 128, 8, 1, 2), (0, 4, 1, 1, 132),
])
def test_persistent_schedule_takes_one_program_per_sm_at_most(row_blocks, heads, segments, head_mib, sms):
    """The persistent kernel's grid: one program per SM, none without a unit (but one at least); the
    heads run together keep their keys within L2_KEY_BYTES (one head at least)."""
    from mlakit.kernels import hopper_prefill

    programs, (units, blocks, heads_out, head_group) = hopper_prefill.persistent_schedule(
        row_blocks, heads, segments, int(head_mib * 2**20), sms)
    assert (units, blocks, heads_out) == (row_blocks * heads * segments, row_blocks, heads)
    assert programs == max(1, min(sms, units))
    assert 1 <= head_group <= heads
    assert head_group == 1 or head_group * int(head_mib * 2**20) <= hopper_prefill.L2_KEY_BYTES


@pytest.mark.parametrize("kernel", ["hopper", "hopper_persistent"])
def test_hopper_tuning_is_refused_off_hopper(kernel):
    """On the CPU (or any GPU but SM90) an explicit hopper tuning names what the kernel needs."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        pytest.skip("an SM90 GPU runs the hopper kernel (tests/test_prefill_hopper_gpu.py)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k_nope, k_pe, v = _kernel_inputs([4], [4], 2, 128, 64, 128, torch.bfloat16, seed=3, device=device)
    cu = _segments([4], device).cu_seqlens
    with pytest.raises(MLAInputError, match="tuning: the hopper kernel needs an SM90 GPU"):
        triton_mha_prefill(q, k_nope, k_pe, v, cu, cu, max_q_len=4, causal=True, softmax_scale=0.1,
                           tuning=PrefillTuning(128, 128, 4, 2, kernel=kernel))


@pytest.mark.parametrize("scale", [0.0, -0.1, float("nan")])
def test_the_kernel_entry_refuses_a_scale_that_is_not_positive(scale):
    """The Hopper kernels take a row's max before scaling its scores, which holds for scales > 0 only."""
    q, k_nope, k_pe, v = (torch.randn(s) for s in ((5, 2, 24), (5, 2, 16), (5, 8), (5, 2, 16)))
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(MLAInputError, match="softmax_scale: expected a finite number > 0"):
        triton_mha_prefill(q, k_nope, k_pe, v, cu, cu, max_q_len=5, causal=True, softmax_scale=scale)
