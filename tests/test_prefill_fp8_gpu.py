"""The fp8 prefill (`mlakit.prefill.fp8`) on an SM90 GPU against the float32 oracle run on the same e4m3 values
(what is left is P's rounding to e4m3) and on the unrounded ones (e4m3's whole error): ragged and empty segments,
q_len > k_len, odd head counts, both causal modes, DeepSeek's and MiniCPM3's widths, both tile settings, two
programs carrying the rings across units, NaN bytes in the rows past the last segment, the merge into an earlier
result, float32 output; and the operands' rounding kernels against their torch oracle, byte for byte."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mlakit.kernels import hopper_prefill
from mlakit.kernels.triton_prefill import HOPPER_TUNING, SHORT_HOPPER_TUNING
from mlakit.prefill.fp8 import fp8_mha_prefill, quantize_prefill_operands
from mlakit.prefill.mha import reference_attention_pass
from paged_inputs import relative_error
from test_prefill import _assert_matches, _kernel_inputs, _oracle_pass, _segments
from test_prefill_fp8 import _torch_operands, _wide_operands, assert_same_operands
from test_prefill_hopper_gpu import CASES, WIDTHS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                       reason="needs an SM90 GPU"),
]

DEVICE = "cuda"
PAD_ROWS = 3
# Against the oracle on the same e4m3 values only P's rounding to e4m3 remains (scores and lse are exact to float32).
SAME_VALUES_TOL = 3e-2
# Against the unrounded values: e4m3's whole error (about 5e-2 on this data, NOTES "FP8 prefill").
UNROUNDED_TOL = 8e-2
# The lse: float32 scores of the same e4m3 values, but the kernel sums the e4m3-rounded P its output is normalized by
# (NOTES p32): each P <= 1 rounds to nearest within 2**-4 of itself, so the lse within log(1 + 2**-4) of the oracle's
# (measured up to 0.0254).
LSE_TOL = math.log1p(2**-4)
NAN_E4M3 = 0x7F


def _quantized(q_lens, k_lens, heads, widths, seed, q=None):
    """Rounded operands of random bf16 inputs (q given unrounded, or drawn) with NaN bytes in every row that is in
    no segment (the PAD_ROWS query rows past the last segment; key rows between the aligned segments and past the
    last: columns of v_t), which the kernel must never let through; and the unrounded inputs. The scales come from
    the valid rows."""
    drawn = _kernel_inputs(q_lens, k_lens, heads, *widths, torch.bfloat16, seed=seed, device=DEVICE,
                           pad_rows=PAD_ROWS)
    valid_q, valid_k = sum(q_lens), sum(k_lens)
    unrounded = (drawn[0][:valid_q] if q is None else q, *(t[:valid_k] for t in drawn[1:]))
    keys = _segments(k_lens, DEVICE)
    ops = quantize_prefill_operands(*(torch.cat([t, torch.zeros_like(t[:PAD_ROWS])]) for t in unrounded),
                                    keys.cu_seqlens)
    ops.q[valid_q:].view(torch.uint8).fill_(NAN_E4M3)
    unused_rows = torch.ones(ops.k_nope.shape[0], dtype=torch.bool, device=DEVICE)
    unused_columns = unused_rows.clone()
    unused_rows[ops.key_rows[:valid_k]], unused_columns[ops.value_columns[:valid_k]] = False, False
    for tensor in (ops.k_nope, ops.k_pe):
        tensor.view(torch.uint8)[unused_rows] = NAN_E4M3
    ops.v_t.view(torch.uint8)[..., unused_columns] = NAN_E4M3
    return ops, unrounded


def _check(q_lens, k_lens, heads, widths, causal, seed, out_dtype=torch.bfloat16, tuning=None):
    ops, unrounded = _quantized(q_lens, k_lens, heads, widths, seed)
    queries, keys = _segments(q_lens, DEVICE), _segments(k_lens, DEVICE)
    scale = (widths[0] + widths[1]) ** -0.5
    out, lse = fp8_mha_prefill(ops, queries.cu_seqlens, max_q_len=queries.max_len, causal=causal, softmax_scale=scale,
                               out_dtype=out_dtype, tuning=tuning)
    rows = sum(q_lens)
    q, k_nope, k_pe, v = ops.dequantized()
    expected_out, expected_lse = _oracle_pass(q, k_nope, k_pe, v, queries, keys, causal=causal, softmax_scale=scale)
    _assert_matches(out[:rows], lse[:rows], expected_out[:rows], expected_lse[:rows], out_tol=SAME_VALUES_TOL,
                    lse_tol=LSE_TOL)
    exact_out, _ = _oracle_pass(*(t.float() for t in unrounded), queries, keys, causal=causal, softmax_scale=scale)
    error = relative_error(out[:rows], exact_out[:rows])
    assert error <= UNROUNDED_TOL, f"error against the unrounded inputs {error:.3g} > {UNROUNDED_TOL}"
    blind = torch.isneginf(expected_lse[:rows])
    assert torch.equal(out[:rows][blind].float(), torch.zeros_like(out[:rows][blind].float()))
    assert out.dtype == out_dtype


@pytest.mark.parametrize("tuning", [HOPPER_TUNING, SHORT_HOPPER_TUNING], ids=["n128s2", "n64s3"])
@pytest.mark.parametrize("programs", [None, 2], ids=["every-sm", "two-programs"])
@pytest.mark.parametrize("widths", WIDTHS, ids=lambda w: "x".join(map(str, w)))
@pytest.mark.parametrize("q_lens, k_lens, heads, causal", CASES)
def test_fp8_prefill_matches_float32_oracle(q_lens, k_lens, heads, causal, widths, programs, tuning, monkeypatch):
    if programs is not None:
        monkeypatch.setattr(hopper_prefill, "sm_count", lambda device: programs)
    _check(q_lens, k_lens, heads, widths, causal, seed=sum(q_lens) + 7 * heads + widths[0] + tuning.block_n,
           tuning=tuning)


@pytest.mark.parametrize("tuning", [dataclasses.replace(t, kernel="hopper") for t in (HOPPER_TUNING, SHORT_HOPPER_TUNING)],
                         ids=["n128s2", "n64s3"])
@pytest.mark.parametrize("widths", WIDTHS, ids=lambda w: "x".join(map(str, w)))
@pytest.mark.parametrize("q_lens, k_lens, heads, causal", CASES)
def test_fp8_prefill_on_one_program_per_row_block_matches_float32_oracle(q_lens, k_lens, heads, causal, widths,
                                                                         tuning):
    """The kernel a pass of few units takes by default (`triton_prefill._one_unit_per_program`), on e4m3 operands."""
    _check(q_lens, k_lens, heads, widths, causal, seed=sum(q_lens) + 5 * heads + widths[0] + tuning.block_n,
           tuning=tuning)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_fp8_prefill_writes_other_output_dtypes(out_dtype):
    _check([300, 130, 1], [300, 400, 700], 5, (128, 64, 128), True, seed=5, out_dtype=out_dtype)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal_first", [True, False])
def test_fp8_prefill_merges_a_second_key_set_into_the_first(causal_first, out_dtype):
    """Keys A, then keys B merged in (into a float32 or a 16-bit out, as `mla_prefill`'s chunked passes keep it:
    `prefill.mha.running_dtype`), equals the oracle doing the same on the same e4m3 values (its result rounded to
    `out_dtype` between the passes too); segments without B keys keep A's result."""
    q_lens, a_lens, b_lens, heads = [200, 7, 64], [260, 7, 64], [500, 0, 33], 3
    first, (q, *_) = _quantized(q_lens, a_lens, heads, (128, 64, 128), seed=1)
    second, _ = _quantized(q_lens, b_lens, heads, (128, 64, 128), seed=2, q=q)
    assert torch.equal(first.q.view(torch.uint8), second.q.view(torch.uint8))
    queries, a_keys, b_keys = (_segments(lens, DEVICE) for lens in (q_lens, a_lens, b_lens))
    scale = 192 ** -0.5
    out, lse = fp8_mha_prefill(first, queries.cu_seqlens, max_q_len=queries.max_len, causal=causal_first,
                               softmax_scale=scale, out_dtype=out_dtype)
    fp8_mha_prefill(second, queries.cu_seqlens, max_q_len=queries.max_len, causal=False, softmax_scale=scale, out=out,
                    lse=lse, merge=True)
    rows = sum(q_lens)
    expected_out, expected_lse = _oracle_pass(*first.dequantized(), queries, a_keys, causal=causal_first,
                                              softmax_scale=scale)
    expected_out = expected_out.to(out_dtype)
    reference_attention_pass(*second.dequantized(), queries, b_keys, causal=False, softmax_scale=scale,
                             out=expected_out, lse=expected_lse, merge=True)
    _assert_matches(out[:rows], lse[:rows], expected_out[:rows].float(), expected_lse[:rows], out_tol=SAME_VALUES_TOL,
                    lse_tol=LSE_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rounding_kernels_equal_their_oracle_byte_for_byte_at_a_realistic_size(dtype):
    """`quantize_prefill_operands`' kernels on the GPU against test_prefill_fp8's torch oracle (float32 on the CPU):
    3000 keys in two segments around an empty one and 3 past the last, 16 heads, DeepSeek's widths, k_nope and v
    halves of one tensor, k_pe and q column slices."""
    inputs = _wide_operands(1000, 3003, 16, (128, 64, 128), dtype, DEVICE, seed=11)
    cu_seqlens_k = _segments([1500, 0, 1500], DEVICE).cu_seqlens
    assert_same_operands(quantize_prefill_operands(*inputs, cu_seqlens_k), _torch_operands(*inputs, cu_seqlens_k))
