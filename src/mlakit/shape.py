"""Model shape of one MLA layer: head counts, latent widths and the softmax scale."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlakit.errors import ConfigError, is_int


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
        if self.rope_scaling_factor <= 0:
            raise ConfigError(f"MLAShape.rope_scaling_factor must be > 0, got {self.rope_scaling_factor!r}")
        if self.mscale_all_dim < 0:
            raise ConfigError(f"MLAShape.mscale_all_dim must be >= 0, got {self.mscale_all_dim!r}")

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
            divisors = [d for d in range(1, self.num_heads + 1) if self.num_heads % d == 0]
            raise ConfigError(
                f"tp_size={tp_size} does not divide num_heads={self.num_heads}; "
                f"use one of {divisors}"
            )
        return dataclasses.replace(self, num_heads=self.num_heads // tp_size)

    @classmethod
    def of_latent(cls, num_heads: int, kv_lora_rank: int, rope_dim: int) -> MLAShape:
        """The shape as far as one attention call's tensors tell it: heads and latent widths
        (d_nope and d_v are not visible there and are set to 1).

        >>> MLAShape.of_latent(16, 512, 64).kv_cache_dim
        576
        """
        return cls(num_heads, kv_lora_rank, 1, rope_dim, 1)

    @classmethod
    def preset(cls, name: str) -> MLAShape:
        """A named model shape: one of `PRESETS` (e.g. "deepseek-v3", "kimi-k2")."""
        key = name.lower()
        if key not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
        return PRESETS[key]

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path) -> MLAShape:
        """Reads a Hugging Face `config.json` (a dict, the file, or its directory).

        >>> MLAShape.from_hf_config({"num_attention_heads": 16, "kv_lora_rank": 512,
        ...     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}).num_heads
        16
        """
        data = _load_hf_config(config)
        missing = [k for k in _HF_REQUIRED_KEYS if data.get(k) is None]
        if missing:
            raise ConfigError(
                f"config is not an MLA (DeepSeek-style) config: missing {missing}; "
                f"expected keys {list(_HF_REQUIRED_KEYS)}"
            )
        rope = data.get("rope_scaling") or data.get("rope_parameters") or {}
        if not isinstance(rope, Mapping):
            raise ConfigError(f"config rope_scaling/rope_parameters must be an object, got {rope!r}")
        # As transformers' DeepSeek attention: any non-default rope type with mscale_all_dim rescales softmax.
        is_yarn = rope.get("rope_type", rope.get("type")) not in (None, "default")
        return cls(
            num_heads=config_int(data, "num_attention_heads"),
            kv_lora_rank=config_int(data, "kv_lora_rank"),
            qk_nope_head_dim=config_int(data, "qk_nope_head_dim"),
            qk_rope_head_dim=config_int(data, "qk_rope_head_dim"),
            v_head_dim=config_int(data, "v_head_dim"),
            q_lora_rank=None if data.get("q_lora_rank") is None else config_int(data, "q_lora_rank"),
            rope_scaling_factor=_config_float(rope, "factor", 1.0) if is_yarn else 1.0,
            mscale_all_dim=_config_float(rope, "mscale_all_dim", 0.0) if is_yarn else 0.0,
        )


def config_int(data: Mapping[str, Any], key: str, default: int | None = None, *, minimum: int = 1) -> int:
    """`data[key]` as an integer >= `minimum`; `default` when the key is absent or null (None: required).

    >>> config_int({"n_group": 8}, "n_group"), config_int({}, "n_group", 1)
    (8, 1)
    >>> config_int({}, "vocab_size")
    Traceback (most recent call last):
    ...
    mlakit.errors.ConfigError: config is missing the required key 'vocab_size'
    """
    value = data.get(key)
    if value is None:
        if default is None:
            raise ConfigError(f"config is missing the required key {key!r}")
        return default
    if not is_int(value):
        raise ConfigError(f"config {key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"config {key} must be >= {minimum}, got {value!r}")
    return int(value)


def config_number(data: Mapping[str, Any], key: str, default: float, *, positive: bool = True) -> float:
    """`data[key]` as a finite float (> 0 when `positive`); `default` when absent or null.

    >>> config_number({"rope_theta": 10000}, "rope_theta", 1.0)
    10000.0
    """
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (positive and value <= 0):
        raise ConfigError(f"config {key} must be a finite number{' > 0' if positive else ''}, got {value!r}")
    return float(value)


def _config_float(data: Mapping[str, Any], key: str, default: float) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"config rope_scaling.{key} must be a number, got {value!r}")
    return float(value)


_HF_REQUIRED_KEYS = ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _load_hf_config(config: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"model config {str(path)!r} does not exist; pass a config.json or its directory")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model config {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"model config {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


PRESETS: dict[str, MLAShape] = {
    "deepseek-v3": MLAShape(128, 512, 128, 64, 128, q_lora_rank=1536, rope_scaling_factor=40.0, mscale_all_dim=1.0),
    "deepseek-r1": MLAShape(128, 512, 128, 64, 128, q_lora_rank=1536, rope_scaling_factor=40.0, mscale_all_dim=1.0),
    "deepseek-v2-lite": MLAShape(16, 512, 128, 64, 128, q_lora_rank=None, rope_scaling_factor=40.0, mscale_all_dim=0.707),
    "kimi-k2": MLAShape(64, 512, 128, 64, 128, q_lora_rank=1536, rope_scaling_factor=32.0, mscale_all_dim=1.0),
    "minicpm3": MLAShape(40, 256, 64, 32, 64, q_lora_rank=768),
}
