"""The one reader of a Hugging Face `config.json`: `mlakit check` (`MLAShape.from_hf_config`) and
the model loader (`DeepseekConfig.from_hf_config`) read every field through it.

Each field is read once, with its type, finiteness and range checked; a refusal is one line
naming the file, the field, what was expected and what came. The rope block
(`rope_scaling`, or transformers v5's `rope_parameters`; `rope_scaling` wins per key) is
read into one `RopeScaling`, so the softmax scale `check` plans with and the rope the model
runs with come from the same values. A block that sets `mscale_all_dim`, or has type "yarn",
must give `factor` (as transformers, which reads `rope_scaling["factor"]` there): both
readers refuse it rather than guess 1.0.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlakit.errors import ConfigError, is_int
from mlakit.shape import MLAShape

ATTENTION_KEYS = ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_ABSENT = object()


@dataclasses.dataclass(frozen=True)
class HFConfig:
    """A config.json's fields and where they came from (`source`, named in every error).

    >>> hf = HFConfig({"vocab_size": 64, "rms_norm_eps": 1e-6})
    >>> hf.integer("vocab_size"), hf.number("rms_norm_eps", 1e-5), hf.integer("n_group", 1)
    (64, 1e-06, 1)
    >>> hf.integer("hidden_size")
    Traceback (most recent call last):
    ...
    mlakit.errors.ConfigError: config: hidden_size: expected an integer >= 1 (a required key), got nothing
    """

    data: Mapping[str, Any]
    source: str = "config"

    def __post_init__(self) -> None:
        if not isinstance(self.data, Mapping):
            raise ConfigError(f"{self.source}: expected a JSON object, got {type(self.data).__name__}")

    @classmethod
    def load(cls, config: HFConfig | Mapping[str, Any] | str | Path) -> HFConfig:
        """`config` itself, a dict, or a config.json (the file or its directory) read from disk."""
        if isinstance(config, HFConfig):
            return config
        if isinstance(config, Mapping):
            return cls(config)
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: does not exist; pass a config.json or its directory (a checkpoint holds config.json and *.safetensors)")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return cls(data, str(path))

    def error(self, field: str, expected: str, got: object) -> ConfigError:
        """The one-line refusal of a field: file, field, what was expected, what came."""
        return ConfigError(f"{self.source}: {field}: expected {expected}, got {got}")

    def _value(self, key: str, expected: str, required: bool, where: Mapping[str, Any] | None, prefix: str) -> Any:
        value = (self.data if where is None else where).get(key)
        if value is None and required:
            raise self.error(prefix + key, f"{expected} (a required key)", "nothing")
        return _ABSENT if value is None else value

    def integer(
        self, key: str, default: int | None = None, *, minimum: int = 1, where: Mapping[str, Any] | None = None, prefix: str = ""
    ) -> int:
        """`key` as an integer >= `minimum`; `default` when absent or null (None: required)."""
        expected = f"an integer >= {minimum}"
        value = self._value(key, expected, default is None, where, prefix)
        if value is _ABSENT:
            return default  # type: ignore[return-value]
        if not is_int(value) or value < minimum:
            raise self.error(prefix + key, expected, repr(value))
        return int(value)

    def number(
        self, key: str, default: float | None, *, above: float = 0.0, where: Mapping[str, Any] | None = None, prefix: str = ""
    ) -> float:
        """`key` as a finite number > `above`; `default` when absent or null (None: required)."""
        expected = f"a finite number > {above:g}"
        value = self._value(key, expected, default is None, where, prefix)
        if value is _ABSENT:
            return default  # type: ignore[return-value]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= above:
            raise self.error(prefix + key, expected, repr(value))
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """`key` as true or false; `default` when absent or null."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, "true or false", repr(value))
        return value

    def choice(self, key: str, options: Sequence[str], default: str) -> str:
        """`key` as one of `options`; `default` when absent or null."""
        value = self.data.get(key)
        if value is None:
            return default
        if value not in options:
            raise self.error(key, f"one of {list(options)}", repr(value))
        return value

    def token_ids(self, key: str, vocab_size: int) -> tuple[int, ...]:
        """`key` as a token id or a list of them, each < `vocab_size` (empty when absent or null)."""
        value = self.data.get(key)
        ids = [] if value is None else value if isinstance(value, list) else [value]
        if not all(is_int(token) and 0 <= token < vocab_size for token in ids):
            raise self.error(key, f"a token id in [0, {vocab_size}) (vocab_size), a list of them or null", repr(value))
        return tuple(int(token) for token in ids)

    def rope_scaling(self) -> RopeScaling:
        """The rope block, validated (see the module docstring)."""
        blocks = [(name, self.data.get(name)) for name in ("rope_parameters", "rope_scaling")]
        for name, block in blocks:
            if block is not None and not isinstance(block, Mapping):
                raise self.error(name, "an object or null", repr(block))
        rope = {k: v for _, block in blocks if block for k, v in block.items()}
        prefix = "rope_scaling." if self.data.get("rope_scaling") else "rope_parameters."
        # rope_theta sits at the top level or (transformers v5) in the rope block, which wins; both are
        # checked. A base <= 1 has no rotation scale.
        theta = self.number("rope_theta", self.number("rope_theta", 10000.0, above=1.0), above=1.0, where=rope, prefix=prefix)
        rope_type = rope.get("rope_type", rope.get("type")) or "default"
        if not isinstance(rope_type, str):
            raise self.error(prefix + "rope_type", "a rope type name such as 'default' or 'yarn'", repr(rope_type))
        if rope_type == "default":
            return RopeScaling(theta=theta)
        mscale_all_dim = self.number("mscale_all_dim", 0.0, where=rope, prefix=prefix) or None
        needs_factor = rope_type == "yarn" or mscale_all_dim is not None
        yarn = rope_type == "yarn"
        return RopeScaling(
            theta=theta,
            rope_type=rope_type,
            factor=self.number("factor", None if needs_factor else 1.0, where=rope, prefix=prefix),
            mscale=self.number("mscale", 0.0, where=rope, prefix=prefix) or None,
            mscale_all_dim=mscale_all_dim,
            original_max_position=self._original_max_position(rope, prefix) if yarn else None,
            beta_fast=self.number("beta_fast", 32.0, where=rope, prefix=prefix),
            beta_slow=self.number("beta_slow", 1.0, where=rope, prefix=prefix),
        )

    def _original_max_position(self, rope: Mapping[str, Any], prefix: str) -> int | None:
        """YaRN's pre-extension context: the block's, else `max_position_embeddings` (as transformers)."""
        if rope.get("original_max_position_embeddings") is not None:
            return self.integer("original_max_position_embeddings", where=rope, prefix=prefix)
        return self.integer("max_position_embeddings", 0, minimum=1) or None

    def mla_shape(self) -> MLAShape:
        """The attention layer's shape (all heads) and its softmax scale's YaRN settings.

        >>> HFConfig({"num_attention_heads": 16, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        ...     "qk_rope_head_dim": 64, "v_head_dim": 128}).mla_shape().kv_cache_dim
        576
        """
        missing = [key for key in ATTENTION_KEYS if self.data.get(key) is None]
        if missing:
            raise ConfigError(f"{self.source}: not an MLA (DeepSeek-style) config: missing {missing}; expected keys {list(ATTENTION_KEYS)}")
        rope_dim = self.integer("qk_rope_head_dim")
        if rope_dim % 2:
            raise self.error("qk_rope_head_dim", "an even number (rope rotates pairs of values)", rope_dim)
        rope = self.rope_scaling()
        return MLAShape(
            num_heads=self.integer("num_attention_heads"),
            kv_lora_rank=self.integer("kv_lora_rank"),
            qk_nope_head_dim=self.integer("qk_nope_head_dim"),
            qk_rope_head_dim=rope_dim,
            v_head_dim=self.integer("v_head_dim"),
            q_lora_rank=None if self.data.get("q_lora_rank") is None else self.integer("q_lora_rank"),
            rope_scaling_factor=rope.factor,
            mscale_all_dim=rope.mscale_all_dim or 0.0,
        )


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A config's rope settings: base, type, and the YaRN parameters (None: not set).

    >>> RopeScaling(theta=10000.0, rope_type="yarn", factor=float("nan"), original_max_position=64)
    Traceback (most recent call last):
    ...
    mlakit.errors.ConfigError: RopeScaling.factor: expected a finite number > 0, got nan
    """

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    original_max_position: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self) -> None:
        for name in ("theta", "factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow"):
            value, above = getattr(self, name), 1.0 if name == "theta" else 0.0
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > above):
                raise ConfigError(f"RopeScaling.{name}: expected a finite number > {above:g}, got {value!r}")
        if self.original_max_position is not None and (not is_int(self.original_max_position) or self.original_max_position < 1):
            raise ConfigError(f"RopeScaling.original_max_position: expected an integer >= 1 or None, got {self.original_max_position!r}")
