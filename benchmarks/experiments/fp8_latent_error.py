"""CPU experiment: the e4m3 round-trip error of the cache's fp8 scale choices on DeepSeek-like latents.

Usage: python benchmarks/experiments/fp8_latent_error.py [TOKENS]
Latent rows `[c_kv ; k_pe]` (512 + 64) shaped like DeepSeek-V3's:
- c_kv: RMSNorm output (unit RMS per token) times a norm weight around 1 (|1 + 0.3 N(0, 1)|),
  with 8 outlier channels whose weight is 10-100x;
- k_pe: keys with per-pair magnitudes log-uniform in [1, 30], rotated by RoPE (theta 10000).
Scales compared: per tensor static 1.0, "auto" (the cache's rule: the first 64 tokens' amax x 2 / 448),
calibrated on every token (same rule), and per token and 128-channel group. Prints, per part, the
relative Frobenius error, the largest error relative to the value for values in e4m3's normal range
and relative to the row part's amax, and the share of values that saturate or fall below the
smallest normal (|value / scale| < 2^-6, where relative precision is lost); for these latents
and for the same latents times 8 (a model with larger norm weights or keys).
"""

import math
import sys

import torch

from mlakit.cache.kv_quant import (
    FP8_SATURATION,
    dequantize,
    fp8_scale_from_rows,
    quantize_rows_per_group,
    quantize_rows_per_tensor,
)

LATENT, ROPE, OUTLIERS, AUTO_TOKENS = 512, 64, 8, 64
SMALLEST_NORMAL = 2.0**-6


def deepseek_like_latents(tokens: int, seed: int = 0) -> torch.Tensor:
    """`[tokens, 576]` float32 rows: normed c_kv with outlier channels, then roped k_pe."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, LATENT, generator=gen)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    weight = (1 + 0.3 * torch.randn(LATENT, generator=gen)).abs()
    outliers = torch.randperm(LATENT, generator=gen)[:OUTLIERS]
    weight[outliers] *= 10 + 90 * torch.rand(OUTLIERS, generator=gen)
    pairs = ROPE // 2
    magnitude = torch.exp(torch.empty(pairs).uniform_(0, math.log(30), generator=gen))
    k = torch.randn(tokens, pairs, 2, generator=gen) * magnitude[:, None]
    angle = torch.arange(tokens)[:, None] * 10000.0 ** (-torch.arange(pairs) / pairs)
    cos, sin = angle.cos(), angle.sin()
    roped = torch.stack([k[..., 0] * cos - k[..., 1] * sin, k[..., 0] * sin + k[..., 1] * cos], dim=-1)
    return torch.cat([normed * weight, roped.flatten(1)], dim=1)


def round_trips(rows: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per scale choice: the dequantized rows and the scale broadcast to them."""
    out = {}
    for name, scale in (
        ("tensor, static 1.0", torch.ones(1)),
        ("tensor, auto (first 64 tokens)", fp8_scale_from_rows(rows[:AUTO_TOKENS])),
        ("tensor, calibrated (all tokens)", fp8_scale_from_rows(rows)),
    ):
        out[name] = (dequantize(quantize_rows_per_tensor(rows, scale), scale), scale.expand_as(rows))
    values, scales = quantize_rows_per_group(rows)
    out["per token and 128-channel group"] = (dequantize(values, scales), scales.repeat_interleave(128, -1)[:, : rows.shape[1]])
    return out


def error_stats(rows: torch.Tensor, got: torch.Tensor, scale: torch.Tensor) -> dict[str, float]:
    """Relative Frobenius error, worst normal-range relative error, worst error / row amax, shares."""
    error = (got - rows).abs()
    scaled = rows.abs() / scale
    normal = (scaled >= SMALLEST_NORMAL) & (scaled < FP8_SATURATION)
    return {
        "frobenius": float(error.norm() / rows.norm()),
        "max_rel_normal": float((error / rows.abs())[normal].max()),
        "max_over_row_amax": float((error / rows.abs().amax(-1, keepdim=True)).max()),
        "saturated_pct": 100 * float((scaled >= FP8_SATURATION).float().mean()),
        "subnormal_pct": 100 * float((scaled < SMALLEST_NORMAL).float().mean()),
    }


def measure(tokens: int = 4096, seed: int = 0, magnitude: float = 1.0) -> dict[tuple[str, str], dict[str, float]]:
    """`{(scale choice, part): error_stats}` for parts "c_kv", "k_pe" and "row" of latents times `magnitude`."""
    rows = deepseek_like_latents(tokens, seed) * magnitude
    parts = {"c_kv": slice(0, LATENT), "k_pe": slice(LATENT, LATENT + ROPE), "row": slice(0, LATENT + ROPE)}
    return {
        (name, part): error_stats(rows[:, cols], got[:, cols], scale[:, cols])
        for name, (got, scale) in round_trips(rows).items()
        for part, cols in parts.items()
    }


def main(tokens: int) -> None:
    print(
        f"{'x':>2} {'scale':34} {'part':5} {'rel. Frob.':>10} {'max rel (normal)':>16} {'max / row amax':>14} "
        f"{'saturated %':>11} {'subnormal %':>11}"
    )
    for magnitude in (1, 8):
        for (name, part), s in measure(tokens, magnitude=magnitude).items():
            print(
                f"{magnitude:2} {name:34} {part:5} {s['frobenius']:10.4f} {s['max_rel_normal']:16.4f} {s['max_over_row_amax']:14.4f} "
                f"{s['saturated_pct']:11.3f} {s['subnormal_pct']:11.2f}"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
