"""An fp8 e4m3 (float8_e4m3fn) oracle that shares no code with mlakit.cache.kv_quant: the 256 codes
decoded from their bits in float64, round-to-nearest-even onto them, and dequantization of a
cache with either scale layout."""

from __future__ import annotations

import functools

import torch

GROUP = 128  # channels per per-group scale, as the fp8 cache format defines it
LARGEST = 448.0


@functools.cache
def e4m3_table() -> torch.Tensor:
    """float64 `[256]`: the value of each e4m3fn code (1 sign, 4 exponent bits of bias 7, 3 mantissa
    bits; no infinities; S.1111.111 is NaN).

    >>> t = e4m3_table()
    >>> t[0x7E].item(), t[0x01].item(), t[0xB8].item(), bool(t[0x7F].isnan())
    (448.0, 0.001953125, -1.0, True)
    """
    values = []
    for code in range(256):
        sign = -1.0 if code >> 7 else 1.0
        exponent, mantissa = (code >> 3) & 0xF, code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values.append(float("nan"))
        elif exponent == 0:
            values.append(sign * mantissa / 8 * 2.0**-6)
        else:
            values.append(sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return torch.tensor(values, dtype=torch.float64)


def decode(stored: torch.Tensor) -> torch.Tensor:
    """float64 values of an fp8 e4m3fn tensor, read through its bits."""
    return e4m3_table()[stored.contiguous().view(torch.uint8).long().cpu()]


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float64 `x` saturated to +-448 and rounded to the nearest e4m3 value, ties to the even code;
    NaN for non-finite inputs (the cache's convention).

    >>> round_to_e4m3(torch.tensor([1.0625, 1.1875, 1000.0, -0.0009765625, float("inf")], dtype=torch.float64)).tolist()
    [1.0, 1.25, 448.0, -0.0, nan]
    """
    positive = e4m3_table()[:127]  # codes 0x00..0x7E, increasing
    magnitude = x.abs().clamp(max=LARGEST)
    above = torch.searchsorted(positive, magnitude.contiguous()).clamp(max=126)
    below = (above - 1).clamp(min=0)
    gap_below, gap_above = magnitude - positive[below], positive[above] - magnitude
    take_above = (gap_above < gap_below) | ((gap_above == gap_below) & (above % 2 == 0))
    rounded = torch.where(take_above, positive[above], positive[below])
    return torch.where(torch.isfinite(x), torch.copysign(rounded, x), torch.nan)


def group_scales(rows: torch.Tensor) -> torch.Tensor:
    """float64 `[tokens, ceil(dim / 128)]`: each 128-channel group's largest finite magnitude / 448
    (1 for a group with none)."""
    tokens, dim = rows.shape
    groups = -(-dim // GROUP)
    scales = torch.ones(tokens, groups, dtype=torch.float64)
    for g in range(groups):
        part = rows[:, g * GROUP : (g + 1) * GROUP].double()
        amax = torch.where(torch.isfinite(part), part.abs(), 0).amax(dim=1)
        scales[:, g] = torch.where(amax > 0, amax / LARGEST, 1.0)
    return scales


def dequantize_cache(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """float64 rows of a cache `[..., dim]`: fp8 codes decoded and multiplied by their scale (one
    element, or one per token and 128-channel group); other dtypes just widened."""
    if cache.dtype != torch.float8_e4m3fn:
        return cache.double().cpu()
    values = decode(cache).view(cache.shape)
    scale = scale.double().cpu()
    if scale.numel() == 1:
        return values * scale.reshape(())
    channel_group = torch.arange(cache.shape[-1]) // GROUP
    return values * scale[..., channel_group]
