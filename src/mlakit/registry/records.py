"""Capability records: what each backend can do, stated once, checked at start-up."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable
from typing import Literal

from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError
from mlakit.shape import MLAShape

Phase = Literal["prefill", "decode"]
PHASES: tuple[Phase, ...] = ("prefill", "decode")
KV_DTYPES = ("bf16", "fp16", "fp8_e4m3")
PAGE_SIZE_PREFERENCE = (64, 32, 16, 128, 1, 256)


@dataclasses.dataclass(frozen=True)
class PageSizeRule:
    """Page sizes a backend takes: a fixed set, or any multiple of `multiple_of` (any when 1).

    >>> PageSizeRule(sizes=frozenset({32, 64})).describe()
    '{32, 64}'
    >>> PageSizeRule(multiple_of=16).accepts(48)
    True
    """

    sizes: frozenset[int] | None = None
    multiple_of: int = 1

    def __post_init__(self) -> None:
        if self.multiple_of < 1:
            raise ConfigError(f"PageSizeRule.multiple_of must be >= 1, got {self.multiple_of}")
        if self.sizes is not None and (not self.sizes or min(self.sizes) < 1):
            raise ConfigError(f"PageSizeRule.sizes must hold positive sizes, got {sorted(self.sizes or ())}")

    def accepts(self, page_size: int) -> bool:
        if self.sizes is not None:
            return page_size in self.sizes
        return page_size >= 1 and page_size % self.multiple_of == 0

    def describe(self) -> str:
        if self.sizes is not None:
            return "{" + ", ".join(str(s) for s in sorted(self.sizes)) + "}"
        return "any" if self.multiple_of == 1 else f"any multiple of {self.multiple_of}"


@dataclasses.dataclass(frozen=True)
class WorkspaceInputs:
    """What a workspace size formula may depend on."""

    shape: MLAShape
    device: DeviceInfo
    page_size: int
    max_batch_size: int
    max_context_len: int
    decode_q_len: int


@dataclasses.dataclass(frozen=True)
class WorkspaceSpec:
    """A backend's workspace: its family (buffers are pooled per device and family),
    whether the kernels need it zero-filled, and its size formula in bytes."""

    family: str
    formula: str
    size_bytes: Callable[[WorkspaceInputs], int]
    zero_filled: bool = False


def triton_interpreter_on() -> bool:
    """Whether Triton kernels run in its CPU interpreter in this process (TRITON_INTERPRET=1).

    >>> isinstance(triton_interpreter_on(), bool)
    True
    """
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclasses.dataclass(frozen=True)
class BackendRecord:
    """Everything resolve() needs to know about a backend, without importing it.

    `capability_majors` lists the CUDA compute-capability majors it runs on (None = any);
    `kv_dtype_min_capability` raises that floor for some KV dtypes (e.g. fp8 needs SM89);
    `decode_kv_dtypes` lists the KV dtypes its decode takes where fewer than `kv_dtypes` (None = the same);
    `max_decode_q_len` is the most query tokens per sequence in decode (1 = no
    speculative decoding, None = any); `latent_extend` says it runs ragged new-token
    segments over their cached prefix in the latent form (`mlakit.mla_extend`; speculative
    verify with uneven draft lengths needs it); `tree_drafts` says its decode takes a
    per-sequence tree mask (EAGLE tree drafts, topk > 1);
    `prefill_fallback` names the backend that serves prefill for a decode-only backend;
    `qk_nope_dims` and `v_dims` list the per-head widths its prefill takes (None = any), like
    `rope_dims` the rope width; `attention_dtype` names the dtype its attention computes in where
    that is coarser than the cache's (None: the cache's or finer);
    `cpu_interpreter` says Triton's CPU interpreter runs its kernels, so a caller that names it
    may run it on the CPU when TRITON_INTERPRET=1 was set before mlakit was imported (auto
    never picks it there).
    """

    name: str
    summary: str
    phases: frozenset[Phase]
    device_kinds: frozenset[str]
    page_sizes: PageSizeRule
    kv_dtypes: frozenset[str]
    auto_rank: int
    preferred_page_size: int
    capability_majors: frozenset[int] | None = None
    kv_dtype_min_capability: tuple[tuple[str, tuple[int, int]], ...] = ()
    decode_kv_dtypes: frozenset[str] | None = None
    max_decode_q_len: int | None = None
    max_heads: int | None = None
    kv_lora_ranks: frozenset[int] | None = None
    rope_dims: frozenset[int] | None = None
    qk_nope_dims: frozenset[int] | None = None
    v_dims: frozenset[int] | None = None
    attention_dtype: str | None = None
    packages: tuple[str, ...] = ()
    install_hint: str = ""
    cuda_graphs: bool = False
    returns_lse: bool = True
    latent_extend: bool = False
    tree_drafts: bool = False
    prefill_fallback: str | None = None
    workspace: WorkspaceSpec | None = None
    cpu_interpreter: bool = False
    verified: str = "not run here"

    def __post_init__(self) -> None:
        if not self.phases or not self.phases <= set(PHASES):
            raise ConfigError(f"backend {self.name!r}: phases must be a non-empty subset of {PHASES}, got {sorted(self.phases)}")
        if not self.kv_dtypes or not self.kv_dtypes <= set(KV_DTYPES):
            raise ConfigError(f"backend {self.name!r}: kv_dtypes must be a non-empty subset of {KV_DTYPES}")
        if self.decode_kv_dtypes is not None and not (self.decode_kv_dtypes and self.decode_kv_dtypes <= self.kv_dtypes
                                                      and "decode" in self.phases):
            raise ConfigError(f"backend {self.name!r}: decode_kv_dtypes must be a non-empty subset of its kv_dtypes, "
                              "for a backend that decodes")
        if not self.page_sizes.accepts(self.preferred_page_size):
            raise ConfigError(f"backend {self.name!r}: preferred_page_size {self.preferred_page_size} is not in its page sizes")
        if self.attention_dtype is not None and self.attention_dtype not in KV_DTYPES:
            raise ConfigError(f"backend {self.name!r}: attention_dtype must be one of {KV_DTYPES}, got {self.attention_dtype!r}")
        if self.prefill_fallback is not None and "prefill" in self.phases:
            raise ConfigError(f"backend {self.name!r} does prefill itself; it cannot name a prefill_fallback")

    def kv_dtypes_for(self, phase: Phase) -> frozenset[str]:
        """The KV dtypes its `phase` takes.

        >>> record = BackendRecord("x", "", frozenset({"prefill", "decode"}), frozenset({"cuda"}), PageSizeRule(),
        ...                        frozenset({"bf16", "fp8_e4m3"}), 0, 64, decode_kv_dtypes=frozenset({"fp8_e4m3"}))
        >>> sorted(record.kv_dtypes_for("prefill")), sorted(record.kv_dtypes_for("decode"))
        (['bf16', 'fp8_e4m3'], ['fp8_e4m3'])
        """
        if phase == "decode" and self.decode_kv_dtypes is not None:
            return self.decode_kv_dtypes
        return self.kv_dtypes

    def missing_packages(self) -> list[str]:
        """The import names among `packages` that are not installed here."""
        return [p for p in self.packages if importlib.util.find_spec(p) is None]

    def hardware_problems(self, device: DeviceInfo, *, named: bool = False) -> list[str]:
        """Why this backend cannot run on `device` at all (empty when it can); `named`: the caller
        asked for this backend by name, which lets a `cpu_interpreter` backend run on this
        machine's CPU under TRITON_INTERPRET=1."""
        if device.kind == "cpu" and device.local and self.cpu_interpreter and named and triton_interpreter_on():
            return []
        if device.kind not in self.device_kinds:
            interpretable = self.cpu_interpreter and device.kind == "cpu"
            hint = " (or name it with TRITON_INTERPRET=1 set to run Triton's CPU interpreter)" if interpretable else ""
            return [f"runs on {' or '.join(sorted(self.device_kinds))}, not on {device.kind}{hint}"]
        if self.capability_majors is not None and device.compute_capability is not None:
            if device.compute_capability[0] not in self.capability_majors:
                wanted = "/".join(f"SM{m}x" for m in sorted(self.capability_majors))
                return [f"needs {wanted}, the device is {device.arch}"]
        return []

    def describe_capabilities(self) -> dict[str, object]:
        """Plain data for `mlakit backends --json`."""
        return {
            "name": self.name,
            "summary": self.summary,
            "phases": sorted(self.phases),
            "devices": sorted(self.device_kinds),
            "compute_capability_majors": None if self.capability_majors is None else sorted(self.capability_majors),
            "kv_dtype_min_capability": {dtype: f"sm{cc[0]}{cc[1]}" for dtype, cc in self.kv_dtype_min_capability},
            "page_sizes": self.page_sizes.describe(),
            "kv_dtypes": [d for d in KV_DTYPES if d in self.kv_dtypes],
            "decode_kv_dtypes": [d for d in KV_DTYPES if d in self.kv_dtypes_for("decode")],
            "max_decode_q_len": self.max_decode_q_len,
            "max_heads": self.max_heads,
            "kv_lora_ranks": None if self.kv_lora_ranks is None else sorted(self.kv_lora_ranks),
            "rope_dims": None if self.rope_dims is None else sorted(self.rope_dims),
            "qk_nope_dims": None if self.qk_nope_dims is None else sorted(self.qk_nope_dims),
            "v_dims": None if self.v_dims is None else sorted(self.v_dims),
            "attention_dtype": self.attention_dtype,
            "packages": list(self.packages),
            "cuda_graphs": self.cuda_graphs,
            "returns_lse": self.returns_lse,
            "latent_extend": self.latent_extend,
            "tree_drafts": self.tree_drafts,
            "prefill_fallback": self.prefill_fallback,
            "workspace": None if self.workspace is None else {
                "family": self.workspace.family,
                "formula": self.workspace.formula,
                "zero_filled": self.workspace.zero_filled,
            },
            "auto_rank": self.auto_rank,
            "verified": self.verified,
        }
