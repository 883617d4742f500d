"""How a decode batch is split across programs, computed on the device from the lengths.

The host knows only sizes (batch, heads, q_len, SM count); the per-sequence split counts
come from `cache_seqlens` on the device, so the plan can be captured in a CUDA graph and
replayed with other lengths.
"""

from __future__ import annotations

import dataclasses

import torch

PROGRAMS_PER_SM = 2
OVERSUBSCRIPTION = 4
MAX_SPLITS = 64


@dataclasses.dataclass(frozen=True)
class SplitGeometry:
    """Host-side sizes of a decode launch: row tiles per sequence and the split ceiling."""

    row_tiles: int
    max_splits: int


def split_geometry(batch: int, rows: int, block_m: int, num_sms: int) -> SplitGeometry:
    """The split ceiling: enough splits for a few waves of programs when the batch alone is too small
    (a long sequence in a ragged batch may take more than its even share), capped at MAX_SPLITS.

    >>> split_geometry(batch=1, rows=128, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=2, max_splits=64)
    >>> split_geometry(batch=128, rows=128, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=2, max_splits=5)
    """
    row_tiles = -(-rows // block_m)
    target = OVERSUBSCRIPTION * PROGRAMS_PER_SM * num_sms
    max_splits = max(1, min(MAX_SPLITS, -(-target // (batch * row_tiles))))
    return SplitGeometry(row_tiles, max_splits)


def decode_split_counts(cache_seqlens: torch.Tensor, geometry: SplitGeometry, block_n: int, num_sms: int) -> torch.Tensor:
    """int32 `[batch]` splits per sequence: each split holds about the same number of KV tiles
    (the batch's tiles over PROGRAMS_PER_SM x SMs programs), so ragged batches are balanced;
    a sequence's split count is rounded to the nearest whole number. No host sync.

    >>> decode_split_counts(torch.tensor([4096, 64, 0], dtype=torch.int32), SplitGeometry(1, 8), 64, 4).tolist()
    [7, 1, 1]
    """
    tiles = (cache_seqlens.long() + block_n - 1) // block_n
    work = tiles.sum() * geometry.row_tiles
    tiles_per_split = torch.clamp((work + PROGRAMS_PER_SM * num_sms - 1) // (PROGRAMS_PER_SM * num_sms), min=1)
    splits = (tiles + tiles_per_split // 2) // tiles_per_split
    return splits.clamp(min=1, max=geometry.max_splits).to(torch.int32)
