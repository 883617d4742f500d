"""The resolved plan: what will run, with every automatic choice explained."""

from __future__ import annotations

import dataclasses
from typing import Any

from mlakit.device import DeviceInfo
from mlakit.shape import MLAShape
from mlakit.workspace import WorkspacePool


@dataclasses.dataclass(frozen=True)
class WorkspaceRequest:
    """One workspace buffer to reserve: its family, the backends sharing it, and its size."""

    family: str
    backends: tuple[str, ...]
    nbytes: int
    zero_filled: bool
    formula: str


@dataclasses.dataclass(frozen=True)
class WarmupReport:
    """What `warm_up` launched before the first request, and how long it took (compiles included)."""

    seconds: float
    calls: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The outcome of `resolve()`: backends, cache layout, graph mode, workspaces and notes.

    `rank_shape` is the per-rank shape (heads divided by `tp_size`); `notes` says why
    each automatic choice was made and why other backends were skipped. `dcp_size` and
    `dcp_interleave` are the decode context parallelism (1: none; `mlakit.distributed`).
    """

    model_shape: MLAShape
    rank_shape: MLAShape
    tp_size: int
    device: DeviceInfo
    prefill_backend: str
    decode_backend: str
    page_size: int
    kv_cache_dtype: str
    decode_q_len: int
    cuda_graphs: bool
    max_batch_size: int
    max_context_len: int
    workspaces: tuple[WorkspaceRequest, ...]
    notes: tuple[str, ...]
    warmup: WarmupReport | None = None
    dcp_size: int = 1
    dcp_interleave: int = 1

    def reserve_workspaces(self, pool: WorkspacePool) -> None:
        """Allocates every workspace of the plan in `pool` on the plan's (local) device."""
        pool.reserve([(w.family, w.nbytes, w.zero_filled) for w in self.workspaces], self.device.torch_device)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON output."""
        return {
            "device": {"kind": self.device.kind, "arch": self.device.arch, "name": self.device.name, "local": self.device.local},
            "model_heads": self.model_shape.num_heads,
            "tp_size": self.tp_size,
            "dcp_size": self.dcp_size,
            "dcp_interleave": self.dcp_interleave,
            "heads_per_rank": self.rank_shape.num_heads,
            "kv_lora_rank": self.rank_shape.kv_lora_rank,
            "qk_rope_head_dim": self.rank_shape.qk_rope_head_dim,
            "softmax_scale": self.rank_shape.softmax_scale,
            "prefill_backend": self.prefill_backend,
            "decode_backend": self.decode_backend,
            "page_size": self.page_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "decode_q_len": self.decode_q_len,
            "cuda_graphs": self.cuda_graphs,
            "max_batch_size": self.max_batch_size,
            "max_context_len": self.max_context_len,
            "workspaces": [dataclasses.asdict(w) | {"backends": list(w.backends)} for w in self.workspaces],
            "notes": list(self.notes),
            "warmup": None if self.warmup is None else {"seconds": self.warmup.seconds, "calls": list(self.warmup.calls)},
        }
