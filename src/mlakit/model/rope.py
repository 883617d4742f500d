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

from mlakit.config.hf import HFConfig, RopeScaling
from mlakit.errors import ConfigError, is_int
from mlakit.shape import yarn_mscale

RopeLayout = Literal["interleaved", "deinterleave", "halves"]
ROPE_LAYOUTS = ("interleaved", "deinterleave", "halves")
ROPE_TYPES = ("default", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rope width, layout, and the config's rope settings (base, optional YaRN scaling).

    >>> rope = RopeConfig(dim=64, layout="deinterleave")
    >>> rope.inverse_frequencies().shape, rope.attention_factor()
    (torch.Size([32]), 1.0)
    """

    dim: int
    layout: RopeLayout
    scaling: RopeScaling = RopeScaling(theta=10000.0)

    def __post_init__(self) -> None:
        if not is_int(self.dim) or self.dim <= 0 or self.dim % 2:
            raise ConfigError(f"rope dim must be a positive even number, got {self.dim}")
        if self.layout not in ROPE_LAYOUTS:
            raise ConfigError(f"rope layout must be one of {ROPE_LAYOUTS}, got {self.layout!r}")
        if self.scaling.rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope type {self.scaling.rope_type!r} is not supported; supported: {list(ROPE_TYPES)}")
        if self.yarn and self.scaling.original_max_position is None:
            raise ConfigError("YaRN rope needs original_max_position_embeddings")

    @classmethod
    def from_hf_config(cls, config: HFConfig | Mapping[str, Any], layout: RopeLayout) -> RopeConfig:
        """Reads `qk_rope_head_dim` and the rope block through the shared reader (`HFConfig`).

        >>> RopeConfig.from_hf_config({"qk_rope_head_dim": 8, "rope_scaling": {"rope_type": "yarn",
        ...     "original_max_position_embeddings": 64}}, "halves")
        Traceback (most recent call last):
        ...
        mlakit.errors.ConfigError: config: rope_scaling.factor: expected a finite number > 0 (a required key), got nothing
        """
        hf = HFConfig.load(config)
        scaling = hf.rope_scaling()
        if scaling.rope_type not in ROPE_TYPES:
            raise hf.error("rope_scaling.rope_type", f"one of {list(ROPE_TYPES)}", repr(scaling.rope_type))
        if scaling.rope_type == "yarn" and scaling.original_max_position is None:
            raise hf.error("rope_scaling.original_max_position_embeddings", "an integer >= 1 for YaRN (or max_position_embeddings)", "nothing")
        return cls(dim=hf.integer("qk_rope_head_dim"), layout=layout, scaling=scaling)

    @property
    def yarn(self) -> bool:
        """Whether the frequencies and magnitudes follow YaRN."""
        return self.scaling.rope_type == "yarn"

    def inverse_frequencies(self) -> torch.Tensor:
        """float32 `[dim / 2]` rotation frequencies (YaRN blends interpolated and extrapolated ones)."""
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim
        extrapolated = 1.0 / self.scaling.theta**exponents
        if not self.yarn:
            return extrapolated
        interpolated = extrapolated / self.scaling.factor
        low, high = self._yarn_correction_range()
        ramp = ((torch.arange(self.dim // 2, dtype=torch.float32) - low) / max(high - low, 0.001)).clamp(0, 1)
        keep_extrapolated = 1 - ramp
        return interpolated * (1 - keep_extrapolated) + extrapolated * keep_extrapolated

    def attention_factor(self) -> float:
        """YaRN's magnitude correction applied to cos and sin (1.0 without YaRN)."""
        if not self.yarn:
            return 1.0
        factor, mscale, mscale_all_dim = self.scaling.factor, self.scaling.mscale, self.scaling.mscale_all_dim
        if mscale and mscale_all_dim:
            return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        return yarn_mscale(factor, 1.0)

    def _yarn_correction_range(self) -> tuple[float, float]:
        scaling = self.scaling

        def correction_dim(rotations: float) -> float:
            return self.dim * math.log(scaling.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(scaling.theta))

        low = math.floor(correction_dim(scaling.beta_fast))
        high = math.ceil(correction_dim(scaling.beta_slow))
        return max(low, 0), min(high, self.dim - 1)


class RotaryEmbedding(torch.nn.Module):
    """Applies rope at given positions to `[..., dim]` tensors (queries `[T, H, dim]`, keys `[T, dim]`).

    >>> rope = RotaryEmbedding(RopeConfig(dim=4, layout="halves"))
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
