"""The fp8 prefill's operands (their Triton kernels under the CPU interpreter, or on the GPU where there is one): the
per-tensor rounding to e4m3 (scales from each tensor's largest magnitude, values within e4m3's precision, v
transposed), every byte equal to the same rule in torch float32 on the CPU (`_torch_operands`, the oracle), and
the refusals naming what is wrong. The attention kernel runs on SM90 GPUs only: test_prefill_fp8_gpu.py."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from mlakit.cache.kv_quant import FP8_DTYPE, FP8_MAX
from mlakit.errors import MLAInputError
from mlakit.prefill.fp8 import Fp8PrefillOperands, fp8_mha_prefill, quantize_prefill_operands, value_columns


CU_SEQLENS_K = torch.tensor([0, 5, 9], dtype=torch.int32)


def _operands(tokens=7, keys=9, heads=3, widths=(128, 64, 128), seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    d_nope, d_rope, d_v = widths
    q = torch.randn(tokens, heads, d_nope + d_rope, generator=gen) * 3
    kv = torch.randn(keys, heads, d_nope + d_v, generator=gen)
    k_pe = torch.randn(keys, d_rope, generator=gen) * 5
    q, kv, k_pe = (t.bfloat16().to(device) for t in (q, kv, k_pe))
    return q, kv[..., :d_nope], k_pe, kv[..., d_nope:]


def _wide_operands(tokens, keys, heads, widths, dtype, device, seed):
    """q (a column slice of wider rows), k_nope and v (the two halves of one tensor) and k_pe (a column slice):
    random signs and magnitudes from 2^-20 to 2^6, never zero."""
    gen = torch.Generator().manual_seed(seed)
    d_nope, d_rope, d_v = widths

    def draw(*shape):
        magnitude = torch.exp2(torch.randint(-20, 6, shape, generator=gen).float())
        magnitude *= 1 + torch.rand(shape, generator=gen)
        return (magnitude * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)).to(dtype).to(device)

    q, kv, rows = draw(tokens, heads, d_nope + d_rope + 8), draw(keys, heads, d_nope + d_v), draw(keys, 40 + d_rope)
    return q[..., :d_nope + d_rope], kv[..., :d_nope], rows[:, 40:], kv[..., d_nope:]


def _torch_scale(*tensors):
    """The float32 scale mapping the tensors' largest magnitude to e4m3's largest (1 if all are zero)."""
    amax = torch.stack([t.float().abs().amax() if t.numel() else torch.zeros(()) for t in tensors]).amax()
    return torch.where(amax > 0, amax / torch.tensor(FP8_MAX), torch.ones_like(amax))


def _torch_e4m3(x, scale):
    """x / scale in e4m3 by the kernels' rule: float32, x times the scale's reciprocal (a division where the scale is
    below float32's smallest normal), clamped, rounded to the nearest e4m3, ties to even (torch's CPU cast)."""
    x = x.float()
    quotient = x * (1 / scale) if scale >= torch.finfo(torch.float32).tiny else x / scale
    return quotient.clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _torch_placed(values, rows, dim, shape):
    """A zero e4m3 tensor of `shape` with `values` copied to `rows` along `dim`."""
    placed = torch.zeros(shape, dtype=FP8_DTYPE, device=values.device)
    placed.view(torch.uint8).index_copy_(dim, rows, values.view(torch.uint8))
    return placed


def _torch_operands(q, k_nope, k_pe, v, cu_seqlens_k):
    """`quantize_prefill_operands` in torch operations on the CPU: its kernels' oracle."""
    q, k_nope, k_pe, v, cu_seqlens_k = (t.cpu() for t in (q, k_nope, k_pe, v, cu_seqlens_k))
    q_scale, k_scale, v_scale = _torch_scale(q), _torch_scale(k_nope, k_pe), _torch_scale(v)
    keys, heads, v_dim = v.shape
    offsets = cu_seqlens_k.long()
    aligned = torch.cat([offsets[:1] * 0, ((offsets.diff() + 15) // 16 * 16).cumsum(0)])
    key = torch.arange(keys, device=offsets.device)
    segment = torch.searchsorted(offsets, key, right=True) - 1
    key_rows = aligned[segment] + key - offsets[segment]
    rows = -(-(keys + 15 * (cu_seqlens_k.shape[0] - 1)) // 16) * 16
    columns = value_columns(key_rows)
    return Fp8PrefillOperands(
        q=_torch_e4m3(q, q_scale),
        k_nope=_torch_placed(_torch_e4m3(k_nope, k_scale), key_rows, 0, (rows, heads, k_nope.shape[-1])),
        k_pe=_torch_placed(_torch_e4m3(k_pe, k_scale), key_rows, 0, (rows, k_pe.shape[-1])),
        v_t=_torch_placed(_torch_e4m3(v, v_scale).permute(1, 2, 0), columns, 2, (heads, v_dim, rows)),
        scales=torch.stack([q_scale * k_scale, v_scale]), cu_seqlens_k=cu_seqlens_k, key_starts=aligned.to(torch.int32),
        key_rows=key_rows, value_columns=columns)


def _on_cpu(ops):
    return Fp8PrefillOperands(**{field.name: getattr(ops, field.name).cpu() for field in dataclasses.fields(ops)})


def assert_same_operands(got, want):
    """Every field equal, byte for byte (e4m3 tensors compared as bytes: NaN codes too)."""
    for field in dataclasses.fields(want):
        a, b = getattr(got, field.name).cpu(), getattr(want, field.name).cpu()
        if b.dtype == FP8_DTYPE:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), field.name


def test_quantized_operands_round_trip_within_e4m3_precision(kernel_device):
    inputs = _operands(device=kernel_device)
    ops = _on_cpu(quantize_prefill_operands(*inputs, CU_SEQLENS_K.to(kernel_device)))
    q, k_nope, k_pe, v = (t.cpu() for t in inputs)
    q_scale = q.float().abs().amax() / FP8_MAX
    k_scale = torch.maximum(k_nope.float().abs().amax(), k_pe.float().abs().amax()) / FP8_MAX
    v_scale = v.float().abs().amax() / FP8_MAX
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
        scale = original.abs().amax() / FP8_MAX
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


def test_the_hopper_kernel_reads_v_t_in_the_order_value_columns_writes():
    """The Hopper kernel's key of each V^T column (`_value_key`, its tail zeroing) and the order its reshape /
    permute gives P (`_p_operand`: operand column 4a + 2b + c takes score column 8b + 2a + c) both invert
    `value_columns`, on the CPU (the jit function's Python body on an integer tensor). The rounding kernel's
    order is checked by the byte-exact tests: they compare the `value_columns` it writes with this function's."""
    from mlakit.kernels import hopper_prefill

    columns = torch.arange(128)
    keys = value_columns(columns)  # key k sits in column keys[k]
    operand = columns.view(1, 128).reshape(1, 8, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(128)  # _p_operand's relabelling
    for name, key_of_column in (("_value_key", hopper_prefill._value_key.fn(columns)), ("_p_operand", operand)):
        assert torch.equal(keys[key_of_column], columns), name


def test_an_all_zero_tensor_gets_scale_one(kernel_device):
    q, k_nope, k_pe, v = _operands(device=kernel_device)
    ops = _on_cpu(quantize_prefill_operands(q, k_nope, k_pe, torch.zeros_like(v), CU_SEQLENS_K.to(kernel_device)))
    assert ops.scales[1] == 1 and not ops.v_t.float().any()


ROUNDING_CASES = [
    # tokens, segment lengths, keys past the last segment, heads, (d_nope, d_rope, d_v)
    (7, [5, 0, 17, 0, 30], 3, 3, (16, 8, 16)),  # empty segments, lengths not multiples of 16, an odd head count
    (5, [13, 0, 20], 0, 3, (128, 64, 128)),  # the real widths
    (3, [16, 32], 0, 1, (24, 8, 20)),  # lengths of whole groups, widths that are not powers of two
    (4, [], 6, 2, (16, 8, 16)),  # no segment: every key is past the last one
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("tokens, k_lens, past, heads, widths", ROUNDING_CASES)
def test_kernels_round_as_the_oracle_byte_for_byte(tokens, k_lens, past, heads, widths, dtype, kernel_device):
    inputs = _wide_operands(tokens, sum(k_lens) + past, heads, widths, dtype, kernel_device, seed=tokens + heads)
    cu_seqlens_k = torch.tensor([0, *k_lens]).cumsum(0).to(torch.int32).to(kernel_device)
    assert_same_operands(quantize_prefill_operands(*inputs, cu_seqlens_k), _torch_operands(*inputs, cu_seqlens_k))


def test_a_nan_input_stays_nan_and_leaves_the_scales_to_the_other_values(kernel_device):
    q, k_nope, k_pe, v = _operands(device=kernel_device)
    q, v = q.clone(), v.clone()
    q[2, 1, 5] = v[3, 0, 7] = float("nan")
    cu_seqlens_k = CU_SEQLENS_K.to(kernel_device)
    ops = quantize_prefill_operands(q, k_nope, k_pe, v, cu_seqlens_k)
    assert ops.q.float().isnan().nonzero().tolist() == [[2, 1, 5]]
    assert ops.v_t.float().isnan().nonzero().tolist() == [[0, 7, ops.value_columns[3].item()]]
    finite = [torch.nan_to_num(t, nan=0.0) for t in (q, k_nope, k_pe, v)]
    want = _torch_operands(*finite, cu_seqlens_k)
    assert torch.equal(ops.scales.cpu(), want.scales)


def test_kernels_give_all_zero_tensors_scale_one(kernel_device):
    q, k_nope, k_pe, v = _wide_operands(5, 21, 3, (16, 8, 16), torch.bfloat16, kernel_device, seed=1)
    inputs = (q.zero_(), k_nope.zero_(), k_pe.zero_(), v)  # q and k (k_nope and k_pe together) all zero
    cu_seqlens_k = torch.tensor([0, 4, 21], dtype=torch.int32, device=kernel_device)
    ops = quantize_prefill_operands(*inputs, cu_seqlens_k)
    assert_same_operands(ops, _torch_operands(*inputs, cu_seqlens_k))
    assert ops.scales[0] == 1 and not ops.q.float().any() and not ops.k_pe.float().any()


@pytest.mark.parametrize("dtype, factor", [(torch.bfloat16, 1), (torch.float16, 1), (torch.bfloat16, 7),
                                           (torch.float32, 7)], ids=str)
def test_kernels_round_ties_to_even_as_the_oracle(dtype, factor, kernel_device):
    """`factor` times every e4m3 value and every midpoint of two neighbours (subnormal ones too), the midpoints'
    neighbours in `dtype`, both signs, with 448 * factor each tensor's largest magnitude: the scale is `factor`
    exactly; with factor 1 every midpoint is a tie, which goes to the even code, and with 7 the reciprocal's
    rounding decides, as in the oracle."""
    codes = torch.arange(0x7F, dtype=torch.uint8).view(FP8_DTYPE).float()
    midpoints = ((codes[:-1] + codes[1:]) / 2 * factor).to(dtype)
    bits = midpoints.view(torch.int32 if dtype == torch.float32 else torch.int16)
    values = torch.cat([(codes * factor).to(dtype), midpoints, (bits + 1).view(dtype), (bits - 1).view(dtype)])
    values = values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(0))]
    values = torch.cat([torch.tensor([FP8_MAX * factor], dtype=dtype), values])
    values = torch.cat([values, -values]).to(kernel_device)

    def cycled(*shape):
        return values.repeat(-(-math.prod(shape) // values.numel()))[:math.prod(shape)].view(shape)

    kv = cycled(40, 2, 32)
    inputs = (cycled(22, 2, 24), kv[..., :16], cycled(40, 8), kv[..., 16:])
    cu_seqlens_k = torch.tensor([0, 7, 40], dtype=torch.int32, device=kernel_device)
    assert_same_operands(quantize_prefill_operands(*inputs, cu_seqlens_k), _torch_operands(*inputs, cu_seqlens_k))


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
    ops = _torch_operands(*_operands(), CU_SEQLENS_K)
    fields = {f.name: getattr(ops, f.name) for f in dataclasses.fields(ops)}
    fields[field] = bad(ops)
    with pytest.raises(MLAInputError, match=re.escape(message)):
        Fp8PrefillOperands(**fields)


def test_fp8_prefill_refuses_a_gpu_it_cannot_run_on():
    ops = _torch_operands(*_operands(), CU_SEQLENS_K)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(MLAInputError, match="operands: the fp8 prefill runs on SM90 GPUs .* got cpu"):
        fp8_mha_prefill(ops, cu_q, max_q_len=4, causal=True, softmax_scale=0.1)
    assert ops.q.dtype == FP8_DTYPE
