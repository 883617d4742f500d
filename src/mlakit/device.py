"""What a configuration runs on: a real local device or a hypothetical one named by architecture."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Literal

import torch

from mlakit.errors import ConfigError

DeviceKind = Literal["cpu", "cuda", "xpu"]


@functools.cache
def sm_count(device: torch.device, off_gpu: int | None = None) -> int:
    """The streaming multiprocessors of CUDA device `device`; off a GPU, `off_gpu` (the count a plan made there
    assumes), which such callers must give.

    >>> sm_count(torch.device("cpu"), off_gpu=4)
    4
    """
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if off_gpu is None:
        raise ValueError(f"sm_count: {device} is not a CUDA device and no off_gpu count was given")
    return off_gpu


# SM counts assumed for a hypothetical device (used by workspace formulas).
_TYPICAL_SMS = {8: 108, 9: 132, 10: 148, 12: 84}
_ARCH_PATTERN = re.compile(r"^sm_?(\d+)(\d)a?$")
# The CUDA compute capabilities a hypothetical device may name (Volta on): a typo such as sm900 is refused, not planned.
KNOWN_CUDA_ARCHS = ("sm70", "sm72", "sm75", "sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm101", "sm103", "sm110",
                    "sm120", "sm121")


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """A device described by kind and architecture.

    `local` is True when the device exists on this machine, so installed packages and
    the real SM count apply; False for a device named only to check a configuration.

    >>> DeviceInfo.from_arch("sm90").compute_capability
    (9, 0)
    """

    kind: DeviceKind
    arch: str
    compute_capability: tuple[int, int] | None = None
    num_sms: int | None = None
    name: str = ""
    local: bool = False
    index: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "cuda", "xpu"):
            raise ConfigError(f"device kind must be 'cpu', 'cuda' or 'xpu', got {self.kind!r}")
        if self.kind == "cuda" and self.compute_capability is None:
            raise ConfigError("a CUDA device needs a compute_capability")

    @property
    def torch_device(self) -> torch.device:
        """The torch device for allocations (only meaningful for a local device)."""
        return torch.device(self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}")

    @classmethod
    def from_arch(cls, arch: str) -> DeviceInfo:
        """A hypothetical device: "cpu", "xpu" or "smXY" (sm80, sm89, sm90, sm100, sm120, ...)."""
        key = arch.strip().lower()
        if key in ("cpu", "xpu"):
            return cls(kind=key, arch=key, name=key)
        match = _ARCH_PATTERN.match(key)
        if not match or f"sm{match.group(1)}{match.group(2)}" not in KNOWN_CUDA_ARCHS:
            raise ConfigError(f"device arch {arch!r} is not one of cpu, xpu, {', '.join(KNOWN_CUDA_ARCHS)}")
        major, minor = int(match.group(1)), int(match.group(2))
        return cls(
            kind="cuda",
            arch=f"sm{major}{minor}",
            compute_capability=(major, minor),
            num_sms=_TYPICAL_SMS.get(major, 108),
            name=f"hypothetical sm{major}{minor}",
        )

    @classmethod
    def detect(cls, device: str | torch.device = "auto") -> DeviceInfo:
        """The local device: "auto" picks CUDA, then XPU, then CPU."""
        requested = str(device)
        if requested == "auto":
            requested = next(kind for kind in ("cuda", "xpu", "cpu") if kind_available(kind))
        try:
            dev = torch.device(requested)
        except RuntimeError as exc:
            raise ConfigError(f"device: expected 'auto', 'cpu', 'cuda[:N]' or 'xpu[:N]', got {requested!r}") from exc
        if dev.type == "cpu":
            return cls(kind="cpu", arch="cpu", name="cpu", local=True)
        if dev.type == "cuda":
            if not kind_available("cuda"):
                raise ConfigError(f"device {requested!r} asked for, but torch sees no CUDA device here")
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            if index >= torch.cuda.device_count():
                raise ConfigError(f"device: expected cuda:N with N < {torch.cuda.device_count()} (the CUDA devices here), got {requested!r}")
            props = torch.cuda.get_device_properties(index)
            return cls(
                kind="cuda",
                arch=f"sm{props.major}{props.minor}",
                compute_capability=(props.major, props.minor),
                num_sms=props.multi_processor_count,
                name=props.name,
                local=True,
                index=index,
            )
        if dev.type == "xpu":
            if not kind_available("xpu"):
                raise ConfigError(f"device {requested!r} asked for, but torch sees no XPU device here")
            index = dev.index or 0
            return cls(kind="xpu", arch="xpu", name=torch.xpu.get_device_name(index), local=True, index=index)
        raise ConfigError(f"device {requested!r} is not supported; use 'auto', 'cpu', 'cuda[:N]' or 'xpu[:N]'")


def kind_available(kind: str) -> bool:
    """Whether torch sees a device of `kind` ("cpu", "cuda" or "xpu") on this machine.

    >>> kind_available("cpu")
    True
    """
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return kind == "cpu"
