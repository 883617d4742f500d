"""The fp8 prefill's operands on the CPU: the per-tensor rounding to e4m3 (scales from each tensor's largest
magnitude, values within e4m3's precision, v transposed) and the refusals naming what is wrong. The kernel itself
runs on SM90 GPUs only: test_prefill_fp8_gpu.py."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.errors import MLAInputError
from mlakit.prefill.fp8 import E4M3_MAX, Fp8PrefillOperands, fp8_mha_prefill, quantize_prefill_operands, value_columns


CU_SEQLENS_K = torch.tensor([0, 5, 9], dtype=torch.int32)


def _operands(tokens=7, keys=9, heads=3, widths=(128, 64, 128), seed=0):
    gen = torch.Generator().manual_seed(seed)
    d_nope, d_rope, d_v = widths
    q = torch.randn(tokens, heads, d_nope + d_rope, generator=gen) * 3
    kv = torch.randn(keys, heads, d_nope + d_v, generator=gen)
    k_pe = torch.randn(keys, d_rope, generator=gen) * 5
    return q.bfloat16(), kv[..., :d_nope].bfloat16(), k_pe.bfloat16(), kv[..., d_nope:].bfloat16()


def test_quantized_operands_round_trip_within_e4m3_precision():
    q, k_nope, k_pe, v = _operands()
    ops = quantize_prefill_operands(q, k_nope, k_pe, v, CU_SEQLENS_K)
    q_scale = q.float().abs().amax() / E4M3_MAX
    k_scale = torch.maximum(k_nope.float().abs().amax(), k_pe.float().abs().amax()) / E4M3_MAX
    v_scale = v.float().abs().amax() / E4M3_MAX
    torch.testing.assert_close(ops.scales, torch.stack([q_scale * k_scale, v_scale]))
    # segments of 5 and 4 keys start at rows 0 and 16 (TMA reads v_t from 16-byte aligned columns), zeros between
    assert ops.key_starts.tolist() == [0, 16, 32] and ops.key_rows.tolist() == [0, 1, 2, 3, 4, 16, 17, 18, 19]
    # v_t's columns hold each group of 16 keys in the kernel's P operand order (`value_columns`)
    assert ops.value_columns.tolist() == [0, 1, 4, 5, 8, 16, 17, 20, 21]
    assert ops.v_t.shape == (3, 128, 48) and ops.k_nope.shape == (48, 3, 128) and ops.k_pe.shape == (48, 64)
    assert torch.equal(ops.cu_seqlens_k, CU_SEQLENS_K)
    unused_rows, unused_columns = torch.ones(48, dtype=torch.bool), torch.ones(48, dtype=torch.bool)
    unused_rows[ops.key_rows], unused_columns[ops.value_columns] = False, False
    assert not ops.k_nope[unused_rows].float().any() and not ops.v_t[..., unused_columns].float().any()
    rows = ops.key_rows
    back = {"q": ops.q.float() * q_scale, "k_nope": ops.k_nope[rows].float() * k_scale,
            "k_pe": ops.k_pe[rows].float() * k_scale,
            "v": ops.v_t[..., ops.value_columns].float().permute(2, 0, 1) * v_scale}
    for name, original in (("q", q), ("k_nope", k_nope), ("k_pe", k_pe), ("v", v)):
        original = original.float()
        # e4m3 keeps 3 mantissa bits: half a step is 1/16 of a normal value, below 2^-6 steps are 2^-9 apart.
        scale = original.abs().amax() / E4M3_MAX
        bound = torch.maximum(original.abs() / 16, torch.full_like(original, 2.0 ** -10) * scale * 1.01)
        assert (back[name] - original).abs().le(bound * 1.001 + 1e-12).all(), name
    for name, originals in (("q", [q]), ("k", [k_nope, k_pe]), ("v", [v])):  # each scale's largest value is exact
        largest = max(t.float().abs().amax() for t in originals)
        got = max(back[n].abs().amax() for n in (["k_nope", "k_pe"] if name == "k" else [name]))
        assert got == largest, name
    q_deq, k_nope_deq, k_pe_deq, v_deq = ops.dequantized()
    scores = torch.einsum("thd,khd->thk", q_deq[..., :128], k_nope_deq) + torch.einsum("thd,kd->thk", q_deq[..., 128:],
                                                                                         k_pe_deq)
    expected = (torch.einsum("thd,khd->thk", back["q"][..., :128], back["k_nope"])
                + torch.einsum("thd,kd->thk", back["q"][..., 128:], back["k_pe"]))
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(v_deq, back["v"])


def test_value_columns_permute_each_aligned_group_of_16_keys():
    keys = torch.arange(4 * 16)
    columns = value_columns(keys)
    assert torch.equal(columns // 16, keys // 16) and torch.equal(columns.sort().values, keys)
    # the order of the P operand: column 4a + 2b + c holds key 8b + 2a + c
    a, b, c = torch.meshgrid(torch.arange(4), torch.arange(2), torch.arange(2), indexing="ij")
    assert torch.equal(value_columns((8 * b + 2 * a + c).flatten()), (4 * a + 2 * b + c).flatten())


def test_an_all_zero_tensor_gets_scale_one():
    q, k_nope, k_pe, v = _operands()
    ops = quantize_prefill_operands(q, k_nope, k_pe, torch.zeros_like(v), CU_SEQLENS_K)
    assert ops.scales[1] == 1 and not ops.v_t.float().any()


@pytest.mark.parametrize("field, bad, message", [
    ("q", lambda ops: ops.q.float(), "q: expected torch.float8_e4m3fn, got torch.float32"),
    ("k_nope", lambda ops: ops.k_nope[:, :2], "k_nope: expected [keys, 3, d_nope]"),
    ("k_pe", lambda ops: ops.k_pe[:, :32], "k_pe: expected (48, 64)"),
    ("v_t", lambda ops: ops.v_t[..., :8], "v_t: expected [3, d_v, 48]"),
    ("v_t", lambda ops: ops.v_t[..., :47].contiguous(), "v_t: expected [3, d_v, 48]"),
    ("key_starts", lambda ops: ops.key_starts.long(), "key_starts: expected int32 [segments + 1]"),
    ("v_t", lambda ops: torch.empty(3, 128, 49, dtype=FP8_DTYPE)[..., :48], "v_t: expected contiguous keys, rows 16-byte"),
    ("scales", lambda ops: ops.scales.double(), "scales: expected float32 [2]"),
    ("value_columns", lambda ops: ops.value_columns[:4], "value_columns: expected int64 [9] (like key_rows)"),
])
def test_operands_refuse_wrong_dtype_or_shape(field, bad, message):
    ops = quantize_prefill_operands(*_operands(), CU_SEQLENS_K)
    fields = {f.name: getattr(ops, f.name) for f in dataclasses.fields(ops)}
    fields[field] = bad(ops)
    with pytest.raises(MLAInputError, match=re.escape(message)):
        Fp8PrefillOperands(**fields)


def test_fp8_prefill_refuses_a_gpu_it_cannot_run_on():
    ops = quantize_prefill_operands(*_operands(), CU_SEQLENS_K)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(MLAInputError, match="operands: the fp8 prefill runs on SM90 GPUs .* got cpu"):
        fp8_mha_prefill(ops, cu_q, max_q_len=4, causal=True, softmax_scale=0.1)
    assert ops.q.dtype == FP8_DTYPE
