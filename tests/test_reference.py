"""The reference backend against an independent float64 oracle on random paged data."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlakit.reference import merge_attention_states, reference_decode, reference_extend
from paged_inputs import (
    assert_lse_close,
    make_paged_batch,
    naive_attention,
    naive_decode,
    relative_error,
    sequence_keys,
)

CASES = [
    # seq_lens, heads, q_len, page_size, kv_dtype
    ([5, 0, 37, 16], 3, 1, 16, "bf16"),
    ([1, 64, 65], 5, 2, 64, "fp16"),
    ([0, 0], 1, 1, 16, "bf16"),
    ([9, 2, 30], 7, 4, 1, "bf16"),
    ([40, 3], 16, 3, 8, "fp8_e4m3"),
    ([17, 33, 1], 2, 2, 32, "fp16"),
]


@pytest.mark.parametrize("seq_lens, heads, q_len, page_size, kv_dtype", CASES)
@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.float64])
def test_reference_decode_matches_float64_oracle(seq_lens, heads, q_len, page_size, kv_dtype, compute_dtype):
    batch = make_paged_batch(seq_lens, heads=heads, q_len=q_len, page_size=page_size, kv_dtype=kv_dtype, seed=len(seq_lens) * heads)
    out, lse = reference_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, compute_dtype=compute_dtype,
    )
    expected_out, expected_lse = naive_decode(batch)
    assert out.dtype == compute_dtype and out.shape == expected_out.shape and lse.shape == expected_lse.shape
    assert torch.isfinite(out).all(), "NaN from unused pages leaked into the output"
    tolerance = 1e-12 if compute_dtype == torch.float64 else 1e-5
    assert relative_error(out, expected_out) < tolerance
    assert_lse_close(lse, expected_lse, atol=tolerance * 10)


def test_reference_decode_per_group_fp8_scales():
    batch = make_paged_batch([20, 0, 50], heads=4, q_len=2, page_size=16, kv_dtype="fp8_e4m3", scale_layout="group", rope_dim=80)
    assert batch.kv_scale.shape[-1] == 2
    out, lse = reference_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, compute_dtype=torch.float64,
    )
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 1e-12
    assert_lse_close(lse, expected_lse, atol=1e-10)


def test_zero_length_and_short_sequences_give_zeros_and_minus_inf():
    batch = make_paged_batch([0, 2], heads=3, q_len=4, page_size=4)
    out, lse = reference_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale,
    )
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()
    # Sequence 1 holds 2 tokens and 4 draft queries: queries 0 and 1 see nothing.
    assert (out[1, :2] == 0).all() and torch.isneginf(lse[1, :, :2]).all()
    assert torch.isfinite(lse[1, :, 2:]).all()


def test_reference_extend_matches_oracle_per_new_token():
    seq_lens, new_counts = [12, 5, 0, 30], [3, 5, 0, 1]
    batch = make_paged_batch(seq_lens, heads=3, page_size=8, seed=7)
    total = sum(new_counts)
    q = torch.randn(total, 3, batch.q.shape[-1], dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(new_counts).cumsum(0).tolist()], dtype=torch.int32)
    out, lse = reference_extend(
        q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu,
        kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, compute_dtype=torch.float64,
    )
    token = 0
    for b, (length, new) in enumerate(zip(seq_lens, new_counts)):
        keys = sequence_keys(batch, b)
        for i in range(new):
            expected_out, expected_lse = naive_attention(q[token], keys[: length - new + i + 1], batch.kv_lora_rank, batch.softmax_scale)
            assert relative_error(out[token], expected_out) < 1e-12
            assert torch.allclose(lse[token], expected_lse, atol=1e-10)
            token += 1
    assert token == total


def test_extend_of_uniform_segments_equals_decode():
    batch = make_paged_batch([20, 9, 31], heads=5, q_len=3, page_size=4, seed=3)
    bsz, q_len, heads, dim = batch.q.shape
    cu = torch.arange(0, (bsz + 1) * q_len, q_len, dtype=torch.int32)
    kwargs = dict(kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale)
    dec_out, dec_lse = reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, **kwargs)
    ext_out, ext_lse = reference_extend(batch.q.reshape(-1, heads, dim), batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, **kwargs)
    assert torch.equal(ext_out.view_as(dec_out), dec_out)
    assert torch.equal(ext_lse.view(bsz, q_len, heads).transpose(1, 2), dec_lse)


def test_four_dim_cache_view_is_accepted():
    batch = make_paged_batch([10, 3], heads=2, page_size=4)
    kwargs = dict(kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale)
    flat = reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, **kwargs)
    headed = reference_decode(batch.q, batch.kv_cache.unsqueeze(2), batch.block_table, batch.cache_seqlens, **kwargs)
    assert torch.equal(flat[0], headed[0]) and torch.equal(flat[1], headed[1])


@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(0, 12),
    split=st.integers(0, 12),
    heads=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_merge_of_two_key_halves_equals_attention_over_all(total, split, heads, seed):
    split = min(split, total)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, 24, generator=gen, dtype=torch.float64)
    keys = torch.randn(total, 24, generator=gen, dtype=torch.float64)
    whole_out, whole_lse = naive_attention(q, keys, 16, 0.3)
    out_a, lse_a = naive_attention(q, keys[:split], 16, 0.3)
    out_b, lse_b = naive_attention(q, keys[split:], 16, 0.3)
    merged_out, merged_lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert not torch.isnan(merged_out).any() and not torch.isnan(merged_lse).any()
    assert torch.allclose(merged_out, whole_out, atol=1e-12)
    if total == 0:
        assert torch.isneginf(merged_lse).all() and (merged_out == 0).all()
    else:
        assert torch.allclose(merged_lse, whole_lse, atol=1e-12)


def test_reference_bounds_memory_by_chunking(monkeypatch):
    import mlakit.reference as reference

    batch = make_paged_batch([40, 17, 0, 33], heads=3, q_len=2, page_size=8, seed=11)
    kwargs = dict(kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, compute_dtype=torch.float64)
    whole = reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, **kwargs)
    monkeypatch.setattr(reference, "_GATHER_BUDGET_BYTES", 1)
    chunked = reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, **kwargs)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])
    assert math.isinf(whole[1][2].max().item())


def test_e4m3_rounded_queries_use_the_hopper_kernels_power_of_two_per_row():
    """The factor the kernel builds from amax's exponent bits (`hopper_common.query_row_factor` with
    E4M3_QUERY_EXPONENT 7, clamped to 2^-113 .. 2^113), emulated on the bits here, rounds every row the same way:
    rows of ordinary, huge, tiny, subnormal and zero magnitude."""
    from mlakit.kernels.hopper_common import E4M3_QUERY_EXPONENT, MAX_FACTOR_EXPONENT, MIN_FACTOR_EXPONENT
    from mlakit.reference import e4m3_rounded_queries

    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(64, 576, generator=gen)
    rows *= torch.pow(2.0, torch.randint(-30, 30, (64, 1), generator=gen).float())
    rows[0] = 0.0
    rows[1] *= 2.0 ** -120  # subnormal largest magnitudes: the factor clamps at 2^113
    rows[2] *= 2.0 ** 100
    q = rows.to(torch.bfloat16).float()
    amax = q.abs().amax(dim=-1, keepdim=True)
    biased = (amax.view(torch.int32) >> 23) & 0xFF
    factor_exponent = (127 + E4M3_QUERY_EXPONENT.value + 127 - biased).clamp(MIN_FACTOR_EXPONENT.value,
                                                                             MAX_FACTOR_EXPONENT.value)
    factor = (factor_exponent << 23).view(torch.float32)
    kernel = (q * factor).to(torch.float8_e4m3fn).float() / factor
    assert torch.equal(e4m3_rounded_queries(q), kernel)
    assert (kernel[3:] != 0).any() and ((q[3:] * factor[3:]).abs().amax(-1) < 256).all()
