"""Rotary position embedding for the rope part of MLA: default and YaRN frequencies, three layouts.

Layouts (how a checkpoint pairs the rope dims and where the rotated values go):
- "interleaved": pairs (x0, x1), (x2, x3), ... rotated in place (DeepSeek-V2);
- "deinterleave": the same pairs, emitted as [all first elements ; all second elements]
  (DeepSeek-V3 with `rope_interleave=True`);
- "halves": pairs (x_i, x_{i+d/2}) rotated in place (the usual rotate-half layout).
Queries and keys go through the same layout, so their dot products match the checkpoint's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import torch

from mlakit.errors import ConfigError
from mlakit.shape import config_int, config_number, yarn_mscale

RopeLayout = Literal["interleaved", "deinterleave", "halves"]
ROPE_LAYOUTS = ("interleaved", "deinterleave", "halves")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rope width, base, layout and optional YaRN scaling (as in a Hugging Face config).

    >>> rope = RopeConfig(dim=64, theta=10000.0, layout="deinterleave")
    >>> rope.inverse_frequencies().shape, rope.attention_factor()
    (torch.Size([32]), 1.0)
    """

    dim: int
    theta: float
    layout: RopeLayout
    yarn_factor: float | None = None
    yarn_original_max_position: int | None = None
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale: float | None = None
    yarn_mscale_all_dim: float | None = None

    def __post_init__(self) -> None:
        if self.dim <= 0 or self.dim % 2:
            raise ConfigError(f"rope dim must be a positive even number, got {self.dim}")
        if self.layout not in ROPE_LAYOUTS:
            raise ConfigError(f"rope layout must be one of {ROPE_LAYOUTS}, got {self.layout!r}")
        if self.yarn_factor is not None and self.yarn_original_max_position is None:
            raise ConfigError("YaRN rope needs original_max_position_embeddings")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], layout: RopeLayout) -> RopeConfig:
        """Reads `qk_rope_head_dim`, `rope_theta` and `rope_scaling`/`rope_parameters`."""
        rope = dict(config.get("rope_parameters") or {}) | dict(config.get("rope_scaling") or {})
        theta = config_number(rope, "rope_theta", config_number(config, "rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        common = dict(dim=config_int(config, "qk_rope_head_dim"), theta=theta, layout=layout)
        if rope_type in (None, "default"):
            return cls(**common)
        if rope_type != "yarn":
            raise ConfigError(f"rope type {rope_type!r} is not supported; supported: default, yarn")
        return cls(
            **common,
            yarn_factor=config_number(rope, "factor", 1.0),
            yarn_original_max_position=config_int(rope, "original_max_position_embeddings"),
            yarn_beta_fast=float(rope.get("beta_fast") or 32),
            yarn_beta_slow=float(rope.get("beta_slow") or 1),
            yarn_mscale=rope.get("mscale"),
            yarn_mscale_all_dim=rope.get("mscale_all_dim"),
        )

    def inverse_frequencies(self) -> torch.Tensor:
        """float32 `[dim / 2]` rotation frequencies (YaRN blends interpolated and extrapolated ones)."""
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim
        extrapolated = 1.0 / self.theta**exponents
        if self.yarn_factor is None:
            return extrapolated
        interpolated = extrapolated / self.yarn_factor
        low, high = self._yarn_correction_range()
        ramp = ((torch.arange(self.dim // 2, dtype=torch.float32) - low) / max(high - low, 0.001)).clamp(0, 1)
        keep_extrapolated = 1 - ramp
        return interpolated * (1 - keep_extrapolated) + extrapolated * keep_extrapolated

    def attention_factor(self) -> float:
        """YaRN's magnitude correction applied to cos and sin (1.0 without YaRN)."""
        if self.yarn_factor is None:
            return 1.0
        if self.yarn_mscale and self.yarn_mscale_all_dim:
            return yarn_mscale(self.yarn_factor, self.yarn_mscale) / yarn_mscale(self.yarn_factor, self.yarn_mscale_all_dim)
        return yarn_mscale(self.yarn_factor, 1.0)

    def _yarn_correction_range(self) -> tuple[float, float]:
        def correction_dim(rotations: float) -> float:
            return self.dim * math.log(self.yarn_original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))

        low = math.floor(correction_dim(self.yarn_beta_fast))
        high = math.ceil(correction_dim(self.yarn_beta_slow))
        return max(low, 0), min(high, self.dim - 1)


class RotaryEmbedding(torch.nn.Module):
    """Applies rope at given positions to `[..., dim]` tensors (queries `[T, H, dim]`, keys `[T, dim]`).

    >>> rope = RotaryEmbedding(RopeConfig(dim=4, theta=10000.0, layout="halves"))
    >>> x = torch.randn(3, 4)
    >>> torch.allclose(rope(x, torch.zeros(3, dtype=torch.long)), x)
    True
    """

    def __init__(self, config: RopeConfig) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("inv_freq", config.inverse_frequencies(), persistent=False)
        self.scale = config.attention_factor()

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None].float() * self.inv_freq[None, :]
        cos = torch.cos(angles) * self.scale
        sin = torch.sin(angles) * self.scale
        while cos.dim() < x.dim():
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        layout = self.config.layout
        if layout == "halves":
            first, second = x.float().chunk(2, dim=-1)
        else:
            first, second = x.float()[..., 0::2], x.float()[..., 1::2]
        rotated_first = first * cos - second * sin
        rotated_second = second * cos + first * sin
        if layout == "interleaved":
            out = torch.stack([rotated_first, rotated_second], dim=-1).flatten(-2)
        else:
            out = torch.cat([rotated_first, rotated_second], dim=-1)
        return out.to(x.dtype)
