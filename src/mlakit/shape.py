"""Model shape of one MLA layer: head counts, latent widths and the softmax scale."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlakit.errors import ConfigError, divisors


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN attention-magnitude correction `0.1 * mscale * ln(factor) + 1` (1.0 for factor <= 1).

    >>> round(yarn_mscale(40.0, 1.0), 4)
    1.3689
    """
    if factor <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass(frozen=True)
class MLAShape:
    """Shape of one MLA attention layer (all heads, before tensor parallelism).

    `rope_scaling_factor` and `mscale_all_dim` carry the YaRN settings that change
    the softmax scale; leave them at 1.0 / 0.0 for models without YaRN.

    >>> shape = MLAShape.preset("deepseek-v3")
    >>> shape.kv_cache_dim, shape.for_tp(8).num_heads
    (576, 16)
    """

    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_scaling_factor: float = 1.0
    mscale_all_dim: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"MLAShape.{name} must be a positive integer, got {value!r}")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank <= 0):
            raise ConfigError(f"MLAShape.q_lora_rank must be a positive integer or None, got {self.q_lora_rank!r}")
        if not math.isfinite(self.rope_scaling_factor) or self.rope_scaling_factor <= 0:
            raise ConfigError(f"MLAShape.rope_scaling_factor must be a finite number > 0, got {self.rope_scaling_factor!r}")
        if not math.isfinite(self.mscale_all_dim) or self.mscale_all_dim < 0:
            raise ConfigError(f"MLAShape.mscale_all_dim must be a finite number >= 0, got {self.mscale_all_dim!r}")

    @property
    def kv_cache_dim(self) -> int:
        """Values cached per token: the latent plus the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width in the decompressed (MHA) form."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """`1/sqrt(d_nope + d_rope)`, times `mscale^2` when YaRN sets mscale_all_dim."""
        scale = self.qk_head_dim**-0.5
        if self.mscale_all_dim:
            scale *= yarn_mscale(self.rope_scaling_factor, self.mscale_all_dim) ** 2
        return scale

    def for_tp(self, tp_size: int) -> MLAShape:
        """The per-rank shape when heads are split over `tp_size` ranks."""
        if not isinstance(tp_size, int) or tp_size <= 0:
            raise ConfigError(f"tp_size must be a positive integer, got {tp_size!r}")
        if self.num_heads % tp_size:
            raise ConfigError(
                f"tp_size={tp_size} does not divide num_heads={self.num_heads}; "
                f"use one of {divisors(self.num_heads)}"
            )
        return dataclasses.replace(self, num_heads=self.num_heads // tp_size)

    @classmethod
    def of_latent(cls, num_heads: int, kv_lora_rank: int, rope_dim: int, nope_dim: int = 1, v_dim: int = 1) -> MLAShape:
        """The shape as far as one attention call's tensors tell it: heads and latent widths, and
        d_nope and d_v where the call shows them (a prefill's q and kv_b_weight; else 1).

        >>> MLAShape.of_latent(16, 512, 64).kv_cache_dim, MLAShape.of_latent(16, 512, 64, 128, 128).v_head_dim
        (576, 128)
        """
        return cls(num_heads, kv_lora_rank, nope_dim, rope_dim, v_dim)

    @classmethod
    def preset(cls, name: str) -> MLAShape:
        """A named model shape: one of `PRESETS` (e.g. "deepseek-v3", "kimi-k2")."""
        key = name.lower()
        if key not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
        return PRESETS[key]

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path) -> MLAShape:
        """Reads a Hugging Face `config.json` (a dict, the file, or its directory) through
        `mlakit.config.hf.HFConfig`, the reader the model loader uses too.

        >>> MLAShape.from_hf_config({"num_attention_heads": 16, "kv_lora_rank": 512,
        ...     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}).num_heads
        16
        """
        from mlakit.config.hf import HFConfig  # the reader builds MLAShapes, so it imports this module

        return HFConfig.load(config).mla_shape()


PRESETS: dict[str, MLAShape] = {
    "deepseek-v3": MLAShape(128, 512, 128, 64, 128, q_lora_rank=1536, rope_scaling_factor=40.0, mscale_all_dim=1.0),
    "deepseek-r1": MLAShape(128, 512, 128, 64, 128, q_lora_rank=1536, rope_scaling_factor=40.0, mscale_all_dim=1.0),
    "deepseek-v2-lite": MLAShape(16, 512, 128, 64, 128, q_lora_rank=None, rope_scaling_factor=40.0, mscale_all_dim=0.707),
    "kimi-k2": MLAShape(64, 512, 128, 64, 128, q_lora_rank=1536, rope_scaling_factor=32.0, mscale_all_dim=1.0),
    "minicpm3": MLAShape(40, 256, 64, 32, 64, q_lora_rank=768),
}
