"""How a decode batch is split across programs, computed on the device from the lengths.

The split kernels run one program per (row tile, part of the plan); a part is a run of work items,
each item a run of one sequence's KV tiles, and every part holds about the same number of tiles
(`balanced_plan`). The host knows only sizes (batch, row tiles, SM count); the items come from
`cache_seqlens` in one tiny kernel launch, so the plan can be captured in a CUDA graph, replayed
with other lengths, and built once per step for all layers.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import triton
import triton.language as tl

# The grid's second dimension holds one row per work item.
MAX_WORK_ROWS = 65535
# The plan computes each part's first item over tiles of this many (part, sequence) pairs.
PART_COUNT_TILE = 4096
# A batch is ragged when its longest sequence holds more than RAGGED_NUM / RAGGED_DEN of the mean
# KV tiles of the non-empty ones.
RAGGED_NUM = tl.constexpr(5)
RAGGED_DEN = tl.constexpr(4)
# A work item: its sequence, the sequence's item count ("splits"), first query token, query tokens,
# the sequence's KV tokens start .. end (whole tiles but the sequence's last), and its partial slot
# (where a sequence of several items keeps this item's float32 partial for the combine).
WORK_FIELDS = tl.constexpr(7)


@dataclasses.dataclass(frozen=True)
class SplitGeometry:
    """Host-side sizes of a decode launch: row tiles per sequence; parts (the split kernels run
    row_tiles x parts programs, one per (row tile, part)); rows of the work item table; partial slots
    (float32 partials the split pass may write); and an even share's splits per sequence (what the
    combine's tiling is chosen by)."""

    row_tiles: int
    parts: int
    work_rows: int
    partial_slots: int
    splits_per_sequence: int

    def __post_init__(self) -> None:
        if self.work_rows > MAX_WORK_ROWS:
            raise ValueError(f"cache_seqlens: the plan needs {self.work_rows} work rows, more than the launch grid "
                             f"holds ({MAX_WORK_ROWS}); split the batch")


def split_geometry(batch: int, rows: int, block_m: int, num_sms: int, programs_per_sm: int = 1) -> SplitGeometry:
    """Sizes of a balanced plan: as many parts as the GPU runs programs at once over the row tiles
    (at least one). A plan has at most batch + parts items (`balanced_plan`: a sequence has at most one
    item more than the shares it spans), and at most 2 x (parts - 1) of them belong to sequences of
    several items (partial slots): each cut of a ragged plan leaves at most two pieces, and in an even
    plan a sequence of k >= 2 items holds at least 3k/4 shares, so such items number at most
    4/3 x parts (at most 2 x (parts - 1) from 3 parts on, and none or two below).

    >>> split_geometry(batch=1, rows=128, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=2, parts=66, work_rows=67, partial_slots=130, splits_per_sequence=66)
    >>> split_geometry(batch=128, rows=16, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=1, parts=132, work_rows=260, partial_slots=262, splits_per_sequence=3)
    """
    row_tiles = -(-rows // block_m)
    parts = max(1, programs_per_sm * num_sms // row_tiles)
    return SplitGeometry(row_tiles, parts, batch + parts, 2 * (parts - 1), min(parts, -(-parts // batch) + 1))


class SequenceSplits(NamedTuple):
    """The plan on the device: per sequence, its item count (`counts`, int32 `[batch]`) and first
    partial slot (`first_slots`; used where the count is above one); the work items (int32
    `[work_rows, WORK_FIELDS]`, sequences in batch order; rows past the last item unused); and the
    first item of each part (`part_items`,
    int32 `[parts + 1]`, the last entry the item count: part p runs items part_items[p] ..
    part_items[p + 1] - 1)."""

    counts: torch.Tensor
    first_slots: torch.Tensor
    work: torch.Tensor
    part_items: torch.Tensor


@triton.jit(do_not_specialize=["batch", "parts", "min_tiles"])
def _balanced_plan_kernel(
    SEQLENS, CU_SEQLENS_Q, COUNTS, FIRST_SLOTS, WORK, PART_ITEMS, batch, parts, min_tiles,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_P: tl.constexpr,
):
    offsets = tl.arange(0, BLOCK_B)
    in_batch = offsets < batch
    first_token = tl.load(CU_SEQLENS_Q + offsets, mask=in_batch, other=0)
    q_tokens = tl.load(CU_SEQLENS_Q + offsets + 1, mask=in_batch, other=0) - first_token
    # Sequences without query rows read nothing: they take no share of the KV.
    seqlen = tl.load(SEQLENS + offsets, mask=in_batch, other=0)
    tiles = tl.where(q_tokens > 0, tl.cdiv(seqlen, BLOCK_N), 0)
    before = tl.cumsum(tiles, 0) - tiles
    total = tl.sum(tiles, 0)
    share = tl.maximum(tl.cdiv(total, parts), min_tiles)
    busy = tl.sum((tiles > 0).to(tl.int32), 0)
    ragged = tl.max(tiles, 0).to(tl.int64) * busy * RAGGED_DEN > total.to(tl.int64) * RAGGED_NUM
    # Ragged: cuts every `share` tiles across sequences. A sequence without tiles still gets one item
    # (its zeros and lse = -inf), in the part where it stands.
    used_parts = tl.maximum(tl.cdiv(total, share), 1)
    cut_first = tl.where(tiles > 0, before // share, tl.minimum(before // share, used_parts - 1))
    cut_splits = tl.where(tiles > 0, (before + tiles - 1) // share - cut_first + 1, 1)
    # Even: each sequence in its nearest whole number of shares, equal runs of tiles.
    even_splits = tl.maximum((tiles + share // 2) // share, 1)
    run = tl.maximum(tl.cdiv(tiles, even_splits), 1)
    even_splits = tl.maximum(tl.cdiv(tiles, run), 1)
    splits = tl.where(in_batch, tl.where(ragged, cut_splits, even_splits), 0)
    first_item = tl.cumsum(splits, 0) - splits
    items = tl.sum(splits, 0)
    slots = tl.where(splits > 1, splits, 0)
    first_slot = tl.cumsum(slots, 0) - slots
    tl.store(COUNTS + offsets, splits, mask=in_batch)
    tl.store(FIRST_SLOTS + offsets, first_slot, mask=in_batch)

    tile: tl.constexpr = [BLOCK_B, BLOCK_S]
    for first_split in range(0, tl.max(splits, 0), BLOCK_S):
        split = tl.broadcast_to(first_split + tl.arange(0, BLOCK_S)[None, :], tile)
        cut = cut_first[:, None] + split
        begin = tl.where(ragged, tl.maximum(cut * share, before[:, None]) - before[:, None], split * run[:, None])
        end = tl.where(ragged, tl.minimum((cut + 1) * share, (before + tiles)[:, None]) - before[:, None],
                       tl.minimum((split + 1) * run[:, None], tiles[:, None]))
        entry = WORK + (first_item[:, None] + split) * WORK_FIELDS
        taken = split < splits[:, None]
        tl.store(entry, tl.broadcast_to(offsets[:, None], tile), mask=taken)
        tl.store(entry + 1, tl.broadcast_to(splits[:, None], tile), mask=taken)
        tl.store(entry + 2, tl.broadcast_to(first_token[:, None], tile), mask=taken)
        tl.store(entry + 3, tl.broadcast_to(q_tokens[:, None], tile), mask=taken)
        tl.store(entry + 4, begin * BLOCK_N, mask=taken)
        tl.store(entry + 5, tl.minimum(end * BLOCK_N, seqlen[:, None]), mask=taken)
        tl.store(entry + 6, first_slot[:, None] + split, mask=taken)
    # Part p's first item. Ragged: the items of every sequence that lie in parts before p; even: the
    # items dealt out in order, each part a whole number of them within one of the others.
    for first in range(0, parts + 1, BLOCK_P):
        part = first + tl.arange(0, BLOCK_P)
        earlier = tl.minimum(tl.maximum(part[:, None] - cut_first[None, :], 0), splits[None, :])
        dealt = tl.cdiv(part.to(tl.int64) * items, parts).to(tl.int32)
        tl.store(PART_ITEMS + part, tl.where(ragged, tl.sum(earlier, 1), dealt), mask=part <= parts)


def balanced_plan(
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    geometry: SplitGeometry,
    block_n: int,
    min_tokens_per_split: int = 1,
) -> SequenceSplits:
    """The balanced plan (`SequenceSplits`) from one kernel launch and no host sync.

    A share is the batch's KV tiles (those of sequences with query rows) over `geometry.parts`, at
    least `min_tokens_per_split` tokens' worth (a split's partial, rows x kv_lora_rank floats written
    and read again by the combine, stays small next to the KV it reads). When the batch is even (its
    longest sequence holds at most RAGGED_NUM / RAGGED_DEN of the mean of the non-empty ones), each
    sequence is cut into its nearest whole number of shares (at least one) of equal runs of tiles,
    and the items are dealt out to the parts in order, a whole number each. When it is ragged, the
    tiles, laid end to end in batch order, are cut every share: part p takes tiles p x share ..
    (p + 1) x share - 1, whichever sequences they belong to, so every part is within one share of
    the others however ragged the lengths (a sequence cut in two costs its second half one more
    start; FlashMLA's scheduler cuts the same way). Either way a sequence's items are its runs of
    tiles in order, given as token ranges (the kernel's tile may divide block_n), and a part's items
    are consecutive.

    Example (on a CUDA tensor, or on CPU under TRITON_INTERPRET=1): lengths [4096, 64, 0] with one
    query token each and 64-token tiles are 64 + 1 + 0 tiles, ragged; over 8 parts a share is 9 tiles,
    so sequence 0 has 8 items (tiles 0-8, 9-17, ..., 63), sequence 1 one (tile 64, in part 7 after
    the end of sequence 0) and sequence 2 one item without tiles: counts `[8, 1, 1]`, part_items
    `[0, 1, 2, 3, 4, 5, 6, 7, 10]`. Lengths [4096, 4096] over 8 parts are even: 4 items of 16 tiles
    each, one per part (part_items `[0, 1, 2, 3, 4, 5, 6, 7, 8]`).
    """
    batch = cache_seqlens.shape[0]
    device = cache_seqlens.device
    counts = torch.empty(batch, dtype=torch.int32, device=device)
    first_slots = torch.empty(batch, dtype=torch.int32, device=device)
    work = torch.empty(geometry.work_rows, WORK_FIELDS, dtype=torch.int32, device=device)
    part_items = torch.empty(geometry.parts + 1, dtype=torch.int32, device=device)
    block_b = max(16, triton.next_power_of_2(batch))
    _balanced_plan_kernel[(1,)](
        cache_seqlens, cu_seqlens_q, counts, first_slots, work, part_items, batch, geometry.parts,
        max(1, -(-min_tokens_per_split // block_n)),
        BLOCK_N=block_n, BLOCK_B=block_b, BLOCK_S=max(1, 4096 // block_b), BLOCK_P=max(1, PART_COUNT_TILE // block_b),
    )
    return SequenceSplits(counts, first_slots, work, part_items)


def fixed_split_plan(
    cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, splits: int, row_tiles: int, block_n: int
) -> tuple[SplitGeometry, SequenceSplits]:
    """The simple engines' scheme: every sequence's tiles in `splits` equal runs (the last ones empty
    where a sequence has fewer tiles), one part per item, in batch order; torch ops on the device,
    no host sync.

    >>> geometry, plan = fixed_split_plan(torch.tensor([300, 0], dtype=torch.int32),
    ...                                   torch.tensor([0, 1, 2], dtype=torch.int32), 2, 1, 64)
    >>> plan.work[:, 4:].tolist()  # tokens start, end, partial slot
    [[0, 192, 0], [192, 300, 1], [0, 0, 2], [0, 0, 3]]
    """
    batch = cache_seqlens.shape[0]
    device = cache_seqlens.device
    items = batch * splits
    geometry = SplitGeometry(row_tiles, items, items, items if splits > 1 else 0, splits)
    split = torch.arange(splits, dtype=torch.int32, device=device).repeat(batch)
    sequence = torch.arange(batch, dtype=torch.int32, device=device).repeat_interleave(splits)
    seqlen = cache_seqlens.to(torch.int32).repeat_interleave(splits)
    per_split = ((seqlen + block_n - 1) // block_n + splits - 1) // splits * block_n
    begin = torch.minimum(split * per_split, seqlen)
    end = torch.minimum(begin + per_split, seqlen)
    work = torch.stack([
        sequence, torch.full_like(sequence, splits), cu_seqlens_q[:-1].repeat_interleave(splits),
        (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).repeat_interleave(splits), begin, end,
        torch.arange(items, dtype=torch.int32, device=device),
    ], dim=1).to(torch.int32)
    counts = torch.full((batch,), splits, dtype=torch.int32, device=device)
    first_slots = torch.arange(0, items, splits, dtype=torch.int32, device=device)
    part_items = torch.arange(items + 1, dtype=torch.int32, device=device)
    return geometry, SequenceSplits(counts, first_slots, work, part_items)
