"""How a decode batch is split across programs, computed on the device from the lengths.

The host knows only sizes (batch, heads, q_len, SM count); the per-sequence split counts
come from `cache_seqlens` on the device, so the plan can be captured in a CUDA graph and
replayed with other lengths.
"""

from __future__ import annotations

import dataclasses

import torch

OVERSUBSCRIPTION = 2
MAX_SPLITS = 512


@dataclasses.dataclass(frozen=True)
class SplitGeometry:
    """Host-side sizes of a decode launch: row tiles per sequence and the split ceiling."""

    row_tiles: int
    max_splits: int


def split_geometry(batch: int, rows: int, block_m: int, num_sms: int, programs_per_sm: int = 2) -> SplitGeometry:
    """The split ceiling: enough splits for a few waves of programs when the batch alone is too small
    (a long sequence in a ragged batch may take more than its even share), capped at MAX_SPLITS.

    >>> split_geometry(batch=1, rows=128, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=2, max_splits=264)
    >>> split_geometry(batch=128, rows=128, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=2, max_splits=3)
    """
    row_tiles = -(-rows // block_m)
    target = OVERSUBSCRIPTION * programs_per_sm * num_sms
    max_splits = max(1, min(MAX_SPLITS, -(-target // (batch * row_tiles))))
    return SplitGeometry(row_tiles, max_splits)


def decode_split_counts(
    cache_seqlens: torch.Tensor,
    geometry: SplitGeometry,
    block_n: int,
    num_sms: int,
    programs_per_sm: int = 2,
    min_tokens_per_split: int = 1,
) -> torch.Tensor:
    """int32 `[batch]` splits per sequence: each split holds about the same number of KV tiles
    (the batch's tiles over programs_per_sm x SMs programs), so ragged batches are balanced;
    a sequence's split count is rounded to the nearest whole number. A split holds at least
    `min_tokens_per_split` tokens, so its partial output (rows x kv_lora_rank floats, written
    and read again by the combine) stays small next to the KV it reads. No host sync.

    >>> decode_split_counts(torch.tensor([4096, 64, 0], dtype=torch.int32), SplitGeometry(1, 8), 64, 4).tolist()
    [7, 1, 1]
    """
    tiles = (cache_seqlens.long() + block_n - 1) // block_n
    work = tiles.sum() * geometry.row_tiles
    programs = programs_per_sm * num_sms
    min_tiles = max(1, -(-min_tokens_per_split // block_n))
    tiles_per_split = torch.clamp((work + programs - 1) // programs, min=min_tiles)
    splits = (tiles + tiles_per_split // 2) // tiles_per_split
    return splits.clamp(min=1, max=geometry.max_splits).to(torch.int32)
