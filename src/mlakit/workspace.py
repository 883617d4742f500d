"""Workspace pools: one buffer per (device, kernel family), reserved at start-up.

Backends of the same family share a buffer (it is sized for the largest request);
different families never share, because some kernels keep state there (trtllm-gen's
zero-initialised semaphores) that another family's scratch writes would corrupt.
A buffer grows only outside CUDA-graph capture: a graph holds raw pointers, so growing
during capture is an error that names the fix.
"""

from __future__ import annotations

import dataclasses

import torch

from mlakit.errors import WorkspaceError


@dataclasses.dataclass
class _Buffer:
    tensor: torch.Tensor
    zero_filled: bool


class WorkspacePool:
    """Caller-owned workspace buffers keyed by (device, family).

    >>> pool = WorkspacePool()
    >>> pool.get("flashinfer", torch.device("cpu"), 1024).numel()
    1024
    >>> pool.nbytes("flashinfer", torch.device("cpu"))
    1024
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], _Buffer] = {}

    def get(self, family: str, device: torch.device | str, nbytes: int, *, zero_filled: bool = False) -> torch.Tensor:
        """A uint8 view of at least `nbytes` of `family`'s buffer on `device`, growing it if needed."""
        if nbytes < 0:
            raise WorkspaceError(f"workspace {family!r}: nbytes must be >= 0, got {nbytes}")
        key = (str(torch.device(device)), family)
        current = self._buffers.get(key)
        if current is not None and current.zero_filled != zero_filled:
            raise WorkspaceError(
                f"workspace family {family!r} was reserved with zero_filled={current.zero_filled}, "
                f"now asked with zero_filled={zero_filled}; one family must have one rule"
            )
        if current is None or current.tensor.numel() < nbytes:
            if _capturing(torch.device(device)):
                have = 0 if current is None else current.tensor.numel()
                raise WorkspaceError(
                    f"workspace {family!r} on {key[0]} must grow from {have} to {nbytes} bytes during CUDA-graph "
                    "capture; reserve it before capture (WorkspacePool.reserve with the plan's max batch and context)"
                )
            make = torch.zeros if zero_filled else torch.empty
            current = _Buffer(make(nbytes, dtype=torch.uint8, device=device), zero_filled)
            self._buffers[key] = current
        return current.tensor[:nbytes]

    def reserve(self, requests: list[tuple[str, int, bool]], device: torch.device | str) -> None:
        """Allocates every (family, nbytes, zero_filled) request up front, e.g. a Plan's workspaces."""
        for family, nbytes, zero_filled in requests:
            self.get(family, device, nbytes, zero_filled=zero_filled)

    def nbytes(self, family: str, device: torch.device | str) -> int:
        """Current size of a family's buffer on a device (0 when none is held)."""
        current = self._buffers.get((str(torch.device(device)), family))
        return 0 if current is None else current.tensor.numel()


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_DEFAULT_POOL = WorkspacePool()


def default_pool() -> WorkspacePool:
    """The process-wide pool the functional API (`mlakit.mla_decode`) draws workspaces from."""
    return _DEFAULT_POOL
