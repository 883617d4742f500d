"""Which rank of a decode-context-parallel (DCP) group caches which token of a sequence.

Tokens are dealt round-robin in blocks of `interleave` positions (vLLM's
`dcp_kv_cache_interleave_size`, 1 by default): global position p belongs to DCP rank
`(p // interleave) % dcp_size`, where it is local position
`(p // (interleave * dcp_size)) * interleave + p % interleave`. A rank's tokens keep their
order, so the keys a query sees on a rank (global positions below some bound) are always a
prefix of the rank's local tokens. Every function works on Python ints and on integer
tensors (element-wise, on their device, without a host sync: safe inside CUDA graphs).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import torch

from mlakit.errors import ConfigError, is_int

Index = TypeVar("Index", int, torch.Tensor)


@dataclasses.dataclass(frozen=True)
class TokenSharding:
    """How a DCP group of `dcp_size` ranks splits every sequence's tokens, `interleave` at a time.

    >>> sharding = TokenSharding(dcp_size=2, interleave=2)
    >>> sharding.owner(torch.arange(8))
    (tensor([0, 0, 1, 1, 0, 0, 1, 1]), tensor([0, 1, 0, 1, 2, 3, 2, 3]))
    >>> sharding.local_length(7, rank=0), sharding.local_length(7, rank=1)
    (4, 3)
    """

    dcp_size: int
    interleave: int = 1

    def __post_init__(self) -> None:
        for name in ("dcp_size", "interleave"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(f"TokenSharding.{name} must be an integer >= 1, got {value!r}")

    def _check_rank(self, rank: int) -> None:
        if not is_int(rank) or not 0 <= rank < self.dcp_size:
            raise ConfigError(f"rank must be a DCP rank in [0, {self.dcp_size}), got {rank!r}")

    def owner(self, positions: Index) -> tuple[Index, Index]:
        """(DCP rank, local position) of each global position.

        >>> TokenSharding(dcp_size=4).owner(9)
        (1, 2)
        """
        block = positions // self.interleave
        local = (block // self.dcp_size) * self.interleave + positions % self.interleave
        return block % self.dcp_size, local

    def global_position(self, rank: int, local: Index) -> Index:
        """The global position of local position `local` on DCP rank `rank` (inverse of `owner`).

        >>> TokenSharding(dcp_size=4).global_position(1, 2)
        9
        """
        self._check_rank(rank)
        block = (local // self.interleave) * self.dcp_size + rank
        return block * self.interleave + local % self.interleave

    def local_length(self, lengths: Index, rank: int) -> Index:
        """How many of a sequence's first `lengths` tokens rank `rank` holds (0 where it holds none).

        >>> TokenSharding(dcp_size=2, interleave=4).local_length(torch.tensor([0, 3, 5, 9, 17]), rank=1)
        tensor([0, 0, 1, 4, 8])
        """
        self._check_rank(rank)
        blocks, partial = lengths // self.interleave, lengths % self.interleave
        whole_blocks_here = (blocks - rank + self.dcp_size - 1) // self.dcp_size
        return whole_blocks_here * self.interleave + partial * (blocks % self.dcp_size == rank)
