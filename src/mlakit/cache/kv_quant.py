"""FP8 (e4m3) storage of latent KV rows: scales, quantization on write, dequantization on read.

Two scale layouts are supported:
- per tensor: a float32 tensor of one element; stored = value / scale;
- per token and 128-channel group: float32 `[num_pages, page_size, ceil(dim / 128)]`,
  each group scaled so its largest magnitude maps to the fp8 maximum.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
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


def quantize_rows_per_tensor(rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 values of `rows / scale`, saturated at the fp8 range (a plain cast would give NaN).

    >>> q = quantize_rows_per_tensor(torch.tensor([[1.0, 1000.0]]), torch.tensor([1.0]))
    >>> q.float().tolist()
    [[1.0, 448.0]]
    """
    scaled = rows.float() / scale.float()
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_rows_per_group(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values and float32 scales `[tokens, groups]` for rows `[tokens, dim]`.

    >>> values, scales = quantize_rows_per_group(torch.randn(3, 300))
    >>> values.shape, scales.shape
    (torch.Size([3, 300]), torch.Size([3, 3]))
    """
    tokens, dim = rows.shape
    groups = num_scale_groups(dim)
    padded = torch.zeros(tokens, groups * SCALE_GROUP, dtype=torch.float32, device=rows.device)
    padded[:, :dim] = rows.float()
    grouped = padded.view(tokens, groups, SCALE_GROUP)
    amax = grouped.abs().amax(dim=-1)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = (grouped / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values.view(tokens, groups * SCALE_GROUP)[:, :dim], scales


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
