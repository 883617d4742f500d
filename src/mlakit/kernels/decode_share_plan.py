"""The equal-share layout of a decode batch, computed inside the split-plan kernel (`decode_split_plan`).

The batch's KV tiles are laid end to end and cut into `parts` shares of equal size, one per group of
`row_tiles` programs; a sequence is cut where a share boundary falls inside it, into one piece per share it
meets. Share j's pieces run one after another on its programs: round k of the plan holds every share's k-th
piece, share j's in row `k x parts + j` in even rounds and `k x parts + parts - 1 - j` in odd ones, so that the
persistent kernel's snake order (`hopper_decode.seesaw_kernel`) keeps each program on its share. Within a share
the pieces keep batch order, except that a piece cut at the share's end goes first, so that both pieces of a cut
sequence run early and its partials merge early (NOTES.md v79, v88).

Every sequence is expected to hold tiles (the plan takes shares only then); the helpers work on vectors over
the batch (BLOCK_B lanes, lanes past the batch masked by `in_batch`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def share_bound(part, total, parts):
    """The first tile of share `part` (of `parts` over `total` tiles): part x total // parts."""
    return (part.to(tl.int64) * total // parts).to(tl.int32)


@triton.jit
def _share_of(tile, total, parts):
    """The share holding tile `tile`: the largest j with `share_bound(j) <= tile`."""
    return tl.minimum((((tile + 1).to(tl.int64) * parts - 1) // total).to(tl.int32), parts - 1)


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _minimum(a, b):
    return tl.minimum(a, b)


@triton.jit
def _shifted(values, offsets, in_batch, batch, step, other, SCRATCH):
    """`values` moved by `step` lanes (lane b gets lane b - step's value; `other` where that lane is outside the
    batch), through `SCRATCH` (int32, one per sequence): Triton has no lane shift. The caller owns SCRATCH
    until it stores its own values there."""
    tl.store(SCRATCH + offsets, values, mask=in_batch)
    tl.debug_barrier()
    source = offsets - step
    moved = tl.load(SCRATCH + source, mask=in_batch & (source >= 0) & (source < batch), other=other)
    tl.debug_barrier()
    return moved


@triton.jit
def share_layout(first_tile, tiles, offsets, in_batch, batch, total, parts, SCRATCH):
    """The share each sequence's first tile (`first_tile`, of `tiles`, in the batch's `total`) falls in, its pieces
    and the round its last piece runs in (its other pieces run in round 0: each is cut at its share's end).
    `SCRATCH` as `_shifted`'s."""
    end_tile = first_tile + tiles
    first_part = _share_of(first_tile, total, parts)
    last_part = _share_of(end_tile - 1, total, parts)
    pieces = tl.where(in_batch, last_part - first_part + 1, 0)
    # A part's first piece belongs to the sequence holding the part's first tile: the sequence itself where it
    # starts there, else the last sequence before it that holds any share boundary.
    holds_boundary = in_batch & (share_bound(last_part, total, parts) >= first_tile)
    holder = _shifted(tl.where(holds_boundary, offsets, -1), offsets, in_batch, batch, 1, -1, SCRATCH)
    latest_holder = tl.associative_scan(holder, 0, _maximum)
    part_head = tl.where(share_bound(first_part, total, parts) == first_tile, offsets, latest_holder)
    # The piece cut at a part's end goes first: the sequences after it in that part move one round later. That piece
    # belongs to the next sequence cut in two or more, where it starts in this sequence's last part.
    cut_start = tl.where(in_batch & (pieces > 1), first_part, parts)
    next_cut_start = tl.associative_scan(_shifted(cut_start, offsets, in_batch, batch, -1, parts, SCRATCH), 0,
                                         _minimum, reverse=True)
    moved = (next_cut_start == last_part).to(tl.int32)
    last_round = tl.where(pieces > 1, 0, offsets - part_head) + moved
    return first_part, pieces, last_round
