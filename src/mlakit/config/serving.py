"""Serving configuration: the choices a serving engine makes at start-up (pure data, validated)."""

from __future__ import annotations

import dataclasses

from mlakit.errors import ConfigError, divisors

AUTO = "auto"
KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "fp8_e4m3")


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """How to serve MLA attention; `resolve()` turns it into a `Plan`.

    `attention_backend` sets both phases; `prefill_backend` / `decode_backend`
    override it per phase. `page_size=None` lets resolve() choose. `cuda_graphs=None`
    turns graphs on where device and backend allow it. Decode runs
    `speculative_num_draft_tokens + 1` query tokens per sequence.
    `speculative_eagle_topk > 1` asks for tree drafts (several candidates per draft step,
    verified with a per-sequence tree mask); `speculative_uneven_drafts` asks for verify
    batches whose sequences carry different numbers of draft tokens (a latent extend).
    `dcp_size > 1` is decode context parallelism over the TP ranks (as vLLM's): each group of
    `dcp_size` consecutive TP ranks splits every sequence's cached tokens, `dcp_interleave`
    tokens at a time, and merges the partial attention results by their log-sum-exps
    (`mlakit.distributed`); it must divide `tp_size`.

    >>> ServingConfig(decode_backend="flashmla", speculative_num_draft_tokens=1).decode_q_len
    2
    """

    attention_backend: str = AUTO
    prefill_backend: str | None = None
    decode_backend: str | None = None
    page_size: int | None = None
    kv_cache_dtype: str = AUTO
    device: str = AUTO
    tp_size: int = 1
    dcp_size: int = 1
    dcp_interleave: int = 1
    speculative_num_draft_tokens: int = 0
    speculative_eagle_topk: int = 1
    speculative_uneven_drafts: bool = False
    max_batch_size: int = 256
    max_context_len: int = 32768
    cuda_graphs: bool | None = None

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.page_size is not None and (not _is_int(self.page_size) or self.page_size <= 0):
            raise ConfigError(f"page_size must be a positive integer or None (choose automatically), got {self.page_size!r}")
        for name, minimum in (
            ("tp_size", 1), ("dcp_size", 1), ("dcp_interleave", 1), ("speculative_num_draft_tokens", 0),
            ("speculative_eagle_topk", 1), ("max_batch_size", 1), ("max_context_len", 1),
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if self.tp_size % self.dcp_size:
            raise ConfigError(
                f"dcp_size={self.dcp_size} does not divide tp_size={self.tp_size}: decode context parallelism splits "
                f"each TP group's ranks into DCP groups; use a dcp_size in {divisors(self.tp_size)}"
            )
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"cuda_graphs must be True, False or None (automatic), got {self.cuda_graphs!r}")
        if not isinstance(self.speculative_uneven_drafts, bool):
            raise ConfigError(f"speculative_uneven_drafts must be True or False, got {self.speculative_uneven_drafts!r}")
        if self.speculative_num_draft_tokens == 0:
            if self.speculative_eagle_topk > 1:
                raise ConfigError(
                    f"speculative_eagle_topk={self.speculative_eagle_topk} (tree drafts) needs speculative decoding: "
                    "set speculative_num_draft_tokens >= 1, or speculative_eagle_topk=1"
                )
            if self.speculative_uneven_drafts:
                raise ConfigError(
                    "speculative_uneven_drafts needs speculative decoding: set speculative_num_draft_tokens >= 1, "
                    "or speculative_uneven_drafts off"
                )
        for name in ("attention_backend", "prefill_backend", "decode_backend"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a backend name or 'auto', got {value!r}")

    @property
    def decode_q_len(self) -> int:
        """Query tokens per sequence in a decode step."""
        return self.speculative_num_draft_tokens + 1

    @property
    def requested_prefill_backend(self) -> str:
        """The prefill backend asked for: the per-phase override, else attention_backend."""
        return self.prefill_backend or self.attention_backend

    @property
    def requested_decode_backend(self) -> str:
        """The decode backend asked for: the per-phase override, else attention_backend."""
        return self.decode_backend or self.attention_backend


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
