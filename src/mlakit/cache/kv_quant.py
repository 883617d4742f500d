"""FP8 (e4m3) storage of latent KV rows: scales, quantization on write, dequantization on read.

Two scale layouts are supported:
- per tensor: a float32 tensor of one element; stored = value / scale;
- per token and 128-channel group: float32 `[num_pages, page_size, ceil(dim / 128)]`,
  each group scaled so its largest magnitude maps to the fp8 maximum.

Finite values beyond the fp8 range saturate at +-448; non-finite inputs (inf, NaN) are stored
as NaN, so a model that overflowed shows it instead of reading back a plausible 448 (which is
what a plain `.to(torch.float8_e4m3fn)` gives for inf with torch 2.13 on a CPU, while torch 2.11
gives NaN: the quantizers do not depend on either). A per-group
scale is computed from the group's finite values only, so one inf does not zero its group. The
quantizers count both cases into an optional int64 `[2]` tensor (saturated, non-finite) with
device ops only.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
# |value / scale| from which e4m3 rounds past 448 (halfway to 480, a step e4m3fn lacks): only
# there does saturating lose more than rounding does, so only there is a value counted.
FP8_SATURATION = 464.0
# The auto / calibrated per-tensor scale maps twice the largest value seen to 448, so later
# values up to 2x larger still fit (vLLM's calculated scales leave about 2.2x).
AUTO_SCALE_HEADROOM = 2.0
SCALE_GROUP = 128
SCALE_NONE, SCALE_PER_TENSOR, SCALE_PER_GROUP = 0, 1, 2

STORAGE_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": FP8_DTYPE,
    "fp32": torch.float32,
}
_STORAGE_NAMES = {dtype: name for name, dtype in STORAGE_DTYPES.items()}


def storage_name(dtype: torch.dtype) -> str:
    """The name of a cache storage dtype (the inverse of STORAGE_DTYPES).

    >>> storage_name(FP8_DTYPE)
    'fp8_e4m3'
    """
    return _STORAGE_NAMES[dtype]


def scale_mode(values: torch.Tensor, scale: torch.Tensor | None) -> int:
    """SCALE_NONE for 16/32-bit values, else SCALE_PER_TENSOR (one element) or SCALE_PER_GROUP.

    >>> scale_mode(torch.zeros(2, 4, dtype=FP8_DTYPE), torch.ones(1)) == SCALE_PER_TENSOR
    True
    """
    if values.dtype != FP8_DTYPE or scale is None:
        return SCALE_NONE
    return SCALE_PER_TENSOR if scale.numel() == 1 else SCALE_PER_GROUP


def num_scale_groups(dim: int) -> int:
    """Number of 128-channel groups covering `dim` values (the last one may be short)."""
    return -(-dim // SCALE_GROUP)


def _saturating_fp8(scaled: torch.Tensor, finite: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
    """`scaled` in fp8, clamped to +-448, NaN where the input was not finite; counts both cases."""
    if counts is not None:
        saturated = (finite & (scaled.abs() >= FP8_SATURATION)).sum()
        counts += torch.stack([saturated, (~finite).sum()])
    return torch.where(finite, scaled.clamp(-FP8_MAX, FP8_MAX), torch.nan).to(FP8_DTYPE)


def quantize_rows_per_tensor(rows: torch.Tensor, scale: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
    """fp8 values of `rows / scale`, saturated at the fp8 range, NaN for non-finite inputs.

    `counts` (int64 `[2]`), when given, grows by the number of saturated values
    (`|value / scale| >= FP8_SATURATION`) and of non-finite inputs.

    >>> counts = torch.zeros(2, dtype=torch.int64)
    >>> q = quantize_rows_per_tensor(torch.tensor([[1.0, 1000.0, float("inf")]]), torch.tensor([1.0]), counts)
    >>> q.float().tolist(), counts.tolist()
    ([[1.0, 448.0, nan]], [1, 1])
    """
    return _saturating_fp8(rows.float() / scale.float(), torch.isfinite(rows), counts)


def quantize_rows_per_group(rows: torch.Tensor, counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values and float32 scales `[tokens, groups]` for rows `[tokens, dim]`.

    Each scale maps its group's largest finite magnitude to 448 (1.0 for a group with none);
    non-finite inputs are stored as NaN and counted into `counts` (int64 `[2]`, as in
    `quantize_rows_per_tensor`), the rest of their group is quantized as usual.

    >>> rows = torch.randn(3, 300)
    >>> rows[0, 5] = float("inf")
    >>> values, scales = quantize_rows_per_group(rows)
    >>> values.shape, scales.shape, int(values.float().isnan().sum()), bool(scales.isfinite().all())
    (torch.Size([3, 300]), torch.Size([3, 3]), 1, True)
    """
    tokens, dim = rows.shape
    groups = num_scale_groups(dim)
    padded = torch.zeros(tokens, groups * SCALE_GROUP, dtype=torch.float32, device=rows.device)
    padded[:, :dim] = rows.float()
    grouped = padded.view(tokens, groups, SCALE_GROUP)
    finite = torch.isfinite(grouped)
    amax = torch.where(finite, grouped.abs(), 0).amax(dim=-1)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = _saturating_fp8(grouped / scales[..., None], finite, counts)
    return values.view(tokens, groups * SCALE_GROUP)[:, :dim], scales


def fp8_scale_from_rows(rows: torch.Tensor, headroom: float = AUTO_SCALE_HEADROOM) -> torch.Tensor:
    """A one-element float32 per-tensor scale `amax * headroom / 448`, amax being the largest
    finite magnitude in `rows`, or 0 when `rows` hold no finite non-zero value; at most float32's
    largest value, where `amax * headroom` would overflow. Device ops only (no host sync), so a
    cache write can call it.

    >>> fp8_scale_from_rows(torch.tensor([[1.0, -224.0, float("inf")]])).tolist()
    [1.0]
    >>> bool(torch.isfinite(fp8_scale_from_rows(torch.full((1, 2), 3e38))))
    True
    """
    rows = rows.float()
    amax = torch.where(torch.isfinite(rows), rows.abs(), 0).amax().reshape(1)
    limits = torch.finfo(torch.float32)
    return torch.where(amax > 0, (amax * headroom / FP8_MAX).clamp(limits.tiny, limits.max), 0)


def dequantize(values: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows `[..., dim]` in `dtype`, undoing either scale layout (a no-op scale for bf16/fp16).

    `scale` is None (unscaled), one element (per tensor), or `[..., groups]` matching the
    leading dimensions of `values` (per token and group).

    >>> rows = torch.randn(4, 256)
    >>> q, s = quantize_rows_per_group(rows)
    >>> bool(((dequantize(q, s) - rows).abs() <= rows.abs().amax() / 8).all())
    True
    """
    out = values.to(dtype)
    if scale is None:
        return out
    if scale.numel() == 1:
        return out * scale.to(dtype).reshape(())
    dim = values.shape[-1]
    expanded = scale.to(dtype).repeat_interleave(SCALE_GROUP, dim=-1)[..., :dim]
    return out * expanded
