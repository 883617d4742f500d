"""The fused gather + decompression kernel on a GPU at DeepSeek and MiniCPM3 widths, against
`rows[slots]` times the weight in float32; the rope columns copied exactly."""

from __future__ import annotations

import itertools

import pytest
import torch

from mlakit.kernels.gather_decompress import gather_decompress

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
WIDTHS = {"deepseek": (512, 128, 128, 64), "minicpm3": (256, 64, 64, 32)}  # rank, nope, v, rope


def _inputs(num_rows: int, m: int, heads: int, rank: int, nope: int, v_dim: int, rope: int, dtype: torch.dtype,
            seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A cache whose rows no slot names hold NaN, int32 slots in random order with repeats, a weight."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rows = torch.randn(num_rows, rank + rope, generator=gen, device=DEVICE).to(dtype)
    slots = torch.randint(0, num_rows // 2, (m,), generator=gen, device=DEVICE, dtype=torch.int32)
    unnamed = torch.ones(num_rows, dtype=torch.bool, device=DEVICE)
    unnamed[slots.long()] = False
    rows[unnamed] = float("nan")
    weight = (torch.randn(heads * (nope + v_dim), rank, generator=gen, device=DEVICE) / rank ** 0.5).to(dtype)
    return rows, slots, weight


def _assert_matches(rows: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor, heads: int, nope: int) -> None:
    k_nope, k_pe, v = gather_decompress(rows, slots, weight, heads, nope)
    rank = weight.shape[1]
    gathered = rows[slots.long()]
    want = (gathered[:, :rank].float() @ weight.float().t()).view(slots.shape[0], heads, -1).to(rows.dtype)
    for name, actual, expected in (("k_nope", k_nope, want[..., :nope]), ("v", v, want[..., nope:])):
        assert torch.isfinite(actual).all(), name
        torch.testing.assert_close(actual.float(), expected.float(), rtol=1e-2, atol=1e-2,
                                   msg=lambda text, name=name: f"{name}: {text}")
    assert torch.equal(k_pe, gathered[:, rank:])
    assert k_pe.data_ptr() % 16 == 0 and k_nope.stride(0) * rows.element_size() % 16 == 0


@pytest.mark.parametrize(("heads", "m", "dtype"),
                         list(itertools.product((16, 128), (1, 300, 4096), (torch.bfloat16, torch.float16))))
def test_deepseek_widths(heads: int, m: int, dtype: torch.dtype) -> None:
    rank, nope, v_dim, rope = WIDTHS["deepseek"]
    rows, slots, weight = _inputs(2 * m + 64, m, heads, rank, nope, v_dim, rope, dtype, seed=heads * m)
    _assert_matches(rows, slots, weight, heads, nope)


@pytest.mark.parametrize(("heads", "m", "dtype"), [(40, 300, torch.bfloat16), (40, 1, torch.float16),
                                                   (40, 4096, torch.float16)])
def test_minicpm3_widths(heads: int, m: int, dtype: torch.dtype) -> None:
    rank, nope, v_dim, rope = WIDTHS["minicpm3"]
    rows, slots, weight = _inputs(2 * m + 64, m, heads, rank, nope, v_dim, rope, dtype, seed=m)
    _assert_matches(rows, slots, weight, heads, nope)


def test_paged_strided_cache_and_repeated_launches() -> None:
    """Rows of a padded page layout starting 2 bytes into their buffer, int64 slots; a second and third call
    (other row counts, same launch key) run the kernel the first compiled (the GPU tests verify each such launch)."""
    rank, nope, v_dim, rope = WIDTHS["deepseek"]
    heads = 16
    rows, slots, weight = _inputs(4096, 1003, heads, rank, nope, v_dim, rope, torch.bfloat16, seed=3)
    pages = torch.full((64, 64, 1 + rank + rope + 7), float("nan"), dtype=rows.dtype, device=DEVICE)
    strided = pages.flatten(0, 1)[:, 1:1 + rank + rope]
    strided.copy_(rows)
    for m in (1003, 997, 1000):
        _assert_matches(strided, slots[:m].long(), weight, heads, nope)
