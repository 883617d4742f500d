"""The registry of backends: records by name, with their kernel entry points.

The registry is the one piece of module-level mutable state in mlakit: a dict filled
when `mlakit.backends` is imported (each backend module registers itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import torch

from mlakit.errors import ConfigError
from mlakit.prefill.metadata import PrefillMetadata
from mlakit.registry.fit import Requirements, backend_problems
from mlakit.registry.records import BackendRecord, Phase


class DecodeKernel(Protocol):
    """The decode entry point every backend implements (shapes as in `mlakit.mla_decode`)."""

    def __call__(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        *,
        kv_lora_rank: int,
        softmax_scale: float,
        kv_scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class DecodeMetadataBuilder(Protocol):
    """Builds a backend's per-step decode metadata (e.g. a split plan) once, for every layer's call.
    `kv_tokens_hint`: the batch's cached tokens in all, as the caller knows it on the host (None: unknown);
    `page_size`: the cache's tokens per page (None: unknown); a backend may use them to choose tiles and plans, never
    for correctness."""

    def __call__(self, cache_seqlens: torch.Tensor, *, q_len: int, heads: int, kv_cache_dtype: str,
                 kv_tokens_hint: int | None = None, page_size: int | None = None) -> object: ...


class CallPreparer(Protocol):
    """Prepares a backend's decode (4-D q) or extend (packed 3-D q) for every later call of one input layout
    over one step's metadata: returns
    `call(q, kv_cache, block_table, cache_seqlens, kv_scale, softmax_scale, out, lse) -> (out, lse or None)`,
    or None where it cannot."""

    def __call__(
        self, metadata: object, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        cache_seqlens: torch.Tensor, kv_scale: torch.Tensor | None, *, kv_lora_rank: int, return_lse: bool,
        out: torch.Tensor | None, lse: torch.Tensor | None,
    ) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None: ...


class PrefillPreparer(Protocol):
    """Prepares a backend's MHA-form prefill for every later call of one input layout over one step's
    `PrefillMetadata` (the caller's `out` and `lse`, or None, among them): returns
    `call(q, kv_cache, kv_b_weight, kv_scale, softmax_scale, out, lse) -> (out, lse)`, which writes into the
    `out` and `lse` it is given (and returns them), or None where it cannot."""

    def __call__(
        self, meta: PrefillMetadata, q: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor,
        kv_scale: torch.Tensor | None, out: torch.Tensor | None, lse: torch.Tensor | None,
    ) -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None: ...


class ExtendMetadataBuilder(Protocol):
    """Builds a backend's per-step extend metadata once, for every layer's call (`kv_tokens_hint` and `page_size` as
    `DecodeMetadataBuilder`'s)."""

    def __call__(
        self, cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, *, max_q_len: int, heads: int, kv_cache_dtype: str,
        kv_tokens_hint: int | None = None, page_size: int | None = None,
    ) -> object: ...


class ExtendKernel(Protocol):
    """The latent-form extend entry point (shapes as in `mlakit.mla_extend`)."""

    def __call__(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        *,
        max_q_len: int,
        kv_lora_rank: int,
        softmax_scale: float,
        kv_scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class PrefillKernel(Protocol):
    """The MHA-form prefill entry point (shapes as in `mlakit.mla_prefill`)."""

    def __call__(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        kv_b_weight: torch.Tensor,
        meta: PrefillMetadata,
        *,
        softmax_scale: float,
        kv_scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclasses.dataclass(frozen=True)
class RegisteredBackend:
    record: BackendRecord
    decode: DecodeKernel | None
    extend: ExtendKernel | None = None
    prefill: PrefillKernel | None = None
    decode_metadata: DecodeMetadataBuilder | None = None
    extend_metadata: ExtendMetadataBuilder | None = None
    writes_outputs: bool = False
    prepare_call: CallPreparer | None = None
    prepare_prefill: PrefillPreparer | None = None


_REGISTRY: dict[str, RegisteredBackend] = {}


def register(
    record: BackendRecord,
    decode: DecodeKernel | None = None,
    extend: ExtendKernel | None = None,
    prefill: PrefillKernel | None = None,
    decode_metadata: DecodeMetadataBuilder | None = None,
    extend_metadata: ExtendMetadataBuilder | None = None,
    writes_outputs: bool = False,
    prepare_call: CallPreparer | None = None,
    prepare_prefill: PrefillPreparer | None = None,
) -> BackendRecord:
    """Adds a backend; a second registration under the same name is an error.

    A backend with `decode_metadata` builds its per-step decode metadata there, and its
    `decode` takes it back as `metadata=` (None when the caller built none); `extend_metadata`
    likewise for `extend`. With `writes_outputs`, `decode` and `extend` take `out=` and `lse=`
    (None: allocate) and write their results there. `prepare_call` (with `decode_metadata` and
    `extend_metadata`) lets `mla_decode` and `mla_extend` keep, in the step's metadata, a call prepared
    for each input layout; `prepare_prefill` (with `prefill`) does the same for `mla_prefill`.

    A record may state prefill without a `prefill` kernel (a vendor prefill mlakit has no
    adapter for yet): resolve() still plans with it, `mla_prefill` refuses it by name.
    """
    if record.name in _REGISTRY:
        raise ConfigError(f"backend {record.name!r} is already registered")
    if ("decode" in record.phases) != (decode is not None):
        raise ConfigError(f"backend {record.name!r}: a decode kernel must be given exactly when the record lists decode")
    if record.latent_extend != (extend is not None):
        raise ConfigError(f"backend {record.name!r}: an extend kernel must be given exactly when the record says latent_extend")
    if prefill is not None and "prefill" not in record.phases:
        raise ConfigError(f"backend {record.name!r}: a prefill kernel was given but the record does not list prefill")
    if decode_metadata is not None and decode is None:
        raise ConfigError(f"backend {record.name!r}: decode metadata was given without a decode kernel")
    if extend_metadata is not None and extend is None:
        raise ConfigError(f"backend {record.name!r}: extend metadata was given without an extend kernel")
    if prepare_call is not None and (decode_metadata is None or extend_metadata is None):
        raise ConfigError(f"backend {record.name!r}: prepare_call works on the step's metadata: give decode_metadata "
                          f"and extend_metadata")
    if prepare_prefill is not None and prefill is None:
        raise ConfigError(f"backend {record.name!r}: prepare_prefill was given without a prefill kernel")
    _REGISTRY[record.name] = RegisteredBackend(record, decode, extend, prefill, decode_metadata, extend_metadata,
                                               writes_outputs, prepare_call, prepare_prefill)
    return record


def missing_adapter(name: str, phase: str) -> str | None:
    """Why mlakit cannot run `phase` on backend `name` although its record may state it, or None.

    >>> missing_adapter("flashmla", "decode") is None
    True
    """
    backend = get_backend(name)
    if phase == "prefill" and "prefill" in backend.record.phases and backend.prefill is None:
        return "states prefill, but mlakit has no adapter for its prefill kernel yet"
    return None


def runnable_problems(record: BackendRecord, phase: Phase, req: Requirements, partner: BackendRecord | None = None) -> list[str]:
    """`backend_problems`, plus a phase the record states but mlakit cannot run yet (`missing_adapter`)."""
    problems = backend_problems(record, phase, req, partner)
    if missing := missing_adapter(record.name, phase):
        problems.append(missing)
    return problems


def _ensure_loaded() -> None:
    import mlakit.backends  # noqa: F401  (registers the built-in backends)


def backend_names() -> list[str]:
    """Registered backend names, in auto-selection order."""
    return [r.name for r in all_records()]


def all_records() -> list[BackendRecord]:
    """Every registered record, in auto-selection order (lowest auto_rank first)."""
    _ensure_loaded()
    return sorted((b.record for b in _REGISTRY.values()), key=lambda r: (r.auto_rank, r.name))


def get_backend(name: str) -> RegisteredBackend:
    """The registered backend called `name`, or a ConfigError listing the known names."""
    _ensure_loaded()
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; registered backends: {backend_names()} (or 'auto')")
    return _REGISTRY[name]
