"""mlakit.cache.kv_quant against the independent e4m3 oracle (tests/fp8_oracle.py): exact codes for
both scale layouts, each group's own scale, one inf spoiling only itself."""

from __future__ import annotations

import torch

from fp8_oracle import decode, dequantize_cache, e4m3_table, group_scales, round_to_e4m3
from mlakit.cache.kv_quant import FP8_DTYPE, dequantize, quantize_rows_per_group, quantize_rows_per_tensor


def _rows(tokens: int, dim: int, seed: int) -> torch.Tensor:
    """Rows whose 128-channel groups differ in magnitude by up to 2^12, with e4m3 ties and edge values."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 2.0 ** torch.randint(-6, 7, (tokens, -(-dim // 128)), generator=gen).repeat_interleave(128, dim=1)[:, :dim]
    rows = torch.randn(tokens, dim, generator=gen) * magnitude
    rows[0, :6] = torch.tensor([1.0625, 1.1875, -0.0009765625, 0.0, 460.0, -500.0])  # ties, a subnormal tie, saturation
    return rows


def test_the_oracle_decodes_every_code_as_torch_does():
    codes = torch.arange(256, dtype=torch.uint8)
    torch_values = codes.view(FP8_DTYPE).double()
    assert torch.equal(torch_values.isnan(), e4m3_table().isnan())
    assert torch.equal(torch_values.nan_to_num(), e4m3_table().nan_to_num())


def test_per_tensor_quantization_gives_the_oracles_codes():
    rows = torch.cat([_rows(8, 300, 0), torch.tensor([[float("inf"), float("-inf"), float("nan")] + [1.0] * 297])])
    scale = torch.tensor([0.75])
    got = decode(quantize_rows_per_tensor(rows, scale)).view(rows.shape)
    expected = round_to_e4m3(rows.double() / 0.75)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())


def test_per_group_quantization_gives_the_oracles_scales_and_codes():
    rows = _rows(16, 300, 1)  # three groups, the last one 44 channels wide
    values, scales = quantize_rows_per_group(rows)
    expected_scales = group_scales(rows)
    assert torch.allclose(scales.double(), expected_scales, rtol=1e-6, atol=0)
    quotient = rows.double() / scales.double().repeat_interleave(128, dim=1)[:, :300]
    assert torch.equal(decode(values).view(rows.shape), round_to_e4m3(quotient))


def test_one_inf_spoils_only_itself_not_its_group():
    """Issue 27: one inf in a row turned its whole 128-channel group into NaN."""
    rows = _rows(2, 256, 2)
    rows[0, 5] = float("inf")
    values, scales = quantize_rows_per_group(rows)
    read_back = dequantize_cache(values.view(1, 2, 256), scales.view(1, 2, 2)).view(2, 256)
    assert read_back.isnan().nonzero().tolist() == [[0, 5]]
    finite = rows.clone()
    finite[0, 5] = 0.0
    assert torch.allclose(scales.double(), group_scales(finite), rtol=1e-6, atol=0)


def test_dequantize_matches_the_oracle_for_both_layouts():
    rows = _rows(6, 300, 3)
    values, scales = quantize_rows_per_group(rows)
    assert torch.equal(dequantize(values, scales, torch.float64), dequantize_cache(values, scales))
    stored = quantize_rows_per_tensor(rows, torch.tensor([0.5]))
    assert torch.equal(dequantize(stored, torch.tensor([0.5]), torch.float64), dequantize_cache(stored, torch.tensor([0.5])))


def test_the_quantizers_saturate_overflow_and_store_non_finite_as_nan_whatever_a_plain_cast_does():
    """A plain cast's inf and overflow handling differs between torch versions (2.13 on a CPU gives
    +-448 for inf, 2.11 gives NaN); the quantizers saturate finite overflow and write NaN for inf
    and NaN themselves."""
    rows = torch.tensor([[1000.0, -1000.0, float("inf"), float("-inf"), float("nan")]])
    stored = quantize_rows_per_tensor(rows, torch.tensor([1.0])).float()
    assert stored[0, :2].tolist() == [448.0, -448.0] and stored[0, 2:].isnan().all()
