"""How a decode batch is split across programs, computed on the device from the lengths.

The host knows only sizes (batch, rows per sequence, SM count); the per-sequence split
counts come from `cache_seqlens` in one tiny kernel launch, so the plan can be captured
in a CUDA graph, replayed with other lengths, and built once per step for all layers.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mlakit.kernels.decode_share_plan import share_bound, share_layout
from mlakit.kernels.interpreter import INTERPRET
from mlakit.kernels.launch import COMPILE_OPTIONS

OVERSUBSCRIPTION = 3
MAX_SPLITS = 512
# A batch is ragged when its busiest sequence has more than RAGGED_NUM / RAGGED_DEN of the mean work:
# its splits then aim at RAGGED_PROGRAMS x the programs the GPU runs at once (NOTES.md v15), or at
# WIDE_RAGGED_PROGRAMS x where a sequence spans WIDE_ROW_TILES row tiles or more (128 heads at two query tokens:
# a split then holds about as many KV tiles as at one token, NOTES.md v76).
RAGGED_NUM = tl.constexpr(5)
RAGGED_DEN = tl.constexpr(4)
RAGGED_PROGRAMS = tl.constexpr(2)
WIDE_RAGGED_PROGRAMS = tl.constexpr(4)
WIDE_ROW_TILES = tl.constexpr(4)
# Batches of at least this many sequences with work take splits of `batched_min_tokens_per_split` (NOTES.md v62).
BATCHED_SEQUENCES = tl.constexpr(16)
# Larger batches keep batch order: the in-program sort takes 8 bytes of shared memory per sequence
# and its compile time grows fast (seconds at 4096); batches that large have a split ceiling of 1 or 2
# (`split_geometry`), so their order matters little.
MAX_SORTED_BATCH = tl.constexpr(1024)
# The plan writes its work items in tiles of at most this many (sequence, split) pairs.
WORK_STORE_TILE = 4096
# Whether a batch that is not ragged takes longer splits where its split counts would ask for more programs than the
# GPU runs at once (the last ones would run as a partial second wave: H100, 16 heads x 48 x 4096, 1.11-1.26x slower;
# NOTES.md v84). Experiments set it False (benchmarks/experiments/setting_ab.py); that also turns off the choice of
# several waves below, which starts from the one-wave counts, and equal shares (plain and ragged), planned there too.
FIT_SPLITS_TO_ONE_WAVE = True
# A unit's fixed cost (prologue, the wait to its first scores, its partial's stores and merge) in KV tiles, which the
# plan is given for the Hopper kernels' 64-row tiles (first fitted at 13 on the bf16 seesaw kernel, H100: ~20 us
# against ~1.6 us a tile, NOTES.md v79, v87). 9 since an A/B of 8 / 13 / 20 on the H200 (NOTES.md v99): at 9, as at 8,
# batches of part-filled waves take equal shares (7-19% faster there), while 8, when it also priced a share's pieces,
# lost the shares that 128 heads x 24 x 16384 x 2 tokens and 48 x 16384 x 1 take (by less than the sixteenth below);
# since v100 the pieces have their own cost (s35a: where 8 or 13 moved only the split counts, they were level or
# slower). Where every busy sequence spans two row tiles or more (the units are compute-bound), a batch that is not
# ragged takes the split counts of two or three waves of programs instead of one where the estimated makespan, waves x
# (a unit's tiles + this cost), is shorter (128 heads x 24 x 16384 x 2 tokens: 96 units over 132 SMs, 4 splits a
# sequence in 3 waves) by a sixteenth at least (measured gains were 4-5% below the estimate's: the combine and merges
# of the extra partials). 0 turns it off.
HOPPER_UNIT_COST_TILES = 9
# The Hopper kernels' fixed cost of a piece of an equal share in the share estimate below, in KV tiles, apart from the
# unit cost of the split counts' estimates since an A/B of 9 / 8 / 7 / 6 / 5 on the H200 (NOTES.md v100): at 7,
# batches whose split counts ran one or two splits over part-filled waves (128 heads x 96 x 2048 / 4096 x 1, 48 x
# 2048 / 4096 x 2, 80 x 1024 x 1, ...) take equal shares, 3-18% faster; at 6 and 5 some that then take shares
# lose (40 x 1024 x 1 +4%, 48 x 1024 x 1 +11%).
HOPPER_SHARE_PIECE_COST_TILES = 7
# With EQUAL_SHARES, where the unit cost applies, a batch whose every sequence is busy at the plan's row tiles takes
# equal shares of the batch's KV tiles instead (`decode_share_plan`: a sequence cut where a share ends, each share's
# pieces run one after another by its row tiles' programs) where a share plus a piece's cost per piece a share runs
# is estimated a sixteenth shorter than the split counts' makespan: batches whose split counts round badly (H100,
# 128 heads: 40 x 8192 x 2 tokens 15% faster, 24 x 16384 5-7%, fp8 11-20%; NOTES.md v88). Only for a persistent
# kernel (`decode_split_counts`): the grid kernels, a program a plan row started in the rows' order, ran the same
# plans 17-36% slower (H200, pages of 16 and 32, bf16 and fp8; NOTES.md v97, v98). False keeps the split counts
# everywhere.
EQUAL_SHARES = True
# With EQUAL_SHARES, whether a ragged batch whose every sequence is busy at the plan's row tiles (two at least, as for
# the multi-wave counts) takes equal shares wherever they fit, without an estimate against its split counts (NOTES.md
# v97: 128 heads, the ragged batch at one token 3% faster, fp8 5%, at two level; at 16 heads 1% slower, so not there;
# only under a persistent kernel: the cp.async kernel, a program a row, ran the ragged batch 36% slower).
# Where a plan may take them, its rows are RAGGED_SHARE_ROWS times the split counts' (a share holding several short
# sequences runs them in rounds of their own).
RAGGED_EQUAL_SHARES = True
RAGGED_SHARE_ROWS = 2
# The Triton versions whose build of the plan kernel was checked on a GPU to lay equal shares out right (3.6.0, 3.7.1,
# 3.8.0 and 3.9.0; their other patch releases are taken as the same). Under 3.7.1 it once counted a share plan's items
# short and left rows uncleared: ptxas had predicated the warp reductions of an if-converted branch on the wrong
# register (NOTES.md, "The plan kernel under Triton 3.7"); the kernel now keeps its reductions out of small runtime
# `if`s, and `make test` compiles it to check that none is predicated. A plan kernel compiled by any other version
# takes no equal shares: the split counts run, slower where shares win.
SHARE_PLAN_TRITONS = ("3.6.", "3.7.", "3.8.", "3.9.")
# The split kernels' grid holds one row per row of the plan (sequences x split ceiling, or RAGGED_SHARE_ROWS times
# that).
MAX_WORK_ROWS = 65535
MULTI_WAVE_MIN_ROW_TILES = tl.constexpr(2)
MULTI_WAVE_MIN_GAIN_DEN = tl.constexpr(16)
# `split_geometry`'s ceiling leaves room for OVERSUBSCRIPTION waves of units.
MAX_PLAN_WAVES = tl.constexpr(OVERSUBSCRIPTION)


@dataclasses.dataclass(frozen=True)
class SplitGeometry:
    """Host-side sizes of a decode launch: row tiles per sequence and the split ceiling."""

    row_tiles: int
    max_splits: int


def split_geometry(batch: int, rows: int, block_m: int, num_sms: int, programs_per_sm: int = 2) -> SplitGeometry:
    """The split ceiling: enough splits for a few waves of programs when the batch alone is too small
    (a long sequence in a ragged batch may take more than its even share), capped at MAX_SPLITS.

    >>> split_geometry(batch=1, rows=128, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=2, max_splits=396)
    >>> split_geometry(batch=128, rows=128, block_m=64, num_sms=132)
    SplitGeometry(row_tiles=2, max_splits=4)
    """
    row_tiles = -(-rows // block_m)
    target = OVERSUBSCRIPTION * programs_per_sm * num_sms
    max_splits = max(1, min(MAX_SPLITS, -(-target // (batch * row_tiles))))
    return SplitGeometry(row_tiles, max_splits)


# A work item's sequence, split, the sequence's split count, first query token, query tokens, and the split's KV
# tokens: its first and its end (OPEN_KV_END for a sequence's last split: the sequence's length at launch).
WORK_FIELDS = tl.constexpr(7)
WORK_FIELDS_TILE = tl.constexpr(8)  # WORK_FIELDS rounded up to a power of two (a tile's width)
OPEN_KV_END = tl.constexpr(1 << 30)
# The work state's order of units (its third field): the plan's order in waves (the persistent kernel's programs
# take theirs in snake order), taken as programs finish (a ragged batch), or equal shares (rows laid out so that the
# snake order keeps program p on share p // R, R row tiles a sequence, round after round: `decode_share_plan`).
ORDER_WAVES = tl.constexpr(0)
ORDER_TAKEN = tl.constexpr(1)
ORDER_SHARES = tl.constexpr(2)


class SequenceSplits(NamedTuple):
    """Per-sequence split counts; the work items, one per (sequence, split) in launch order (longest
    splits first; an equal-share plan's in rounds, `decode_share_plan`), each `[sequence, split, splits, first
    query token, query tokens, first KV token, end KV token]` (int32 `[batch x max_splits, WORK_FIELDS]`, or
    RAGGED_SHARE_ROWS times those rows where a ragged batch may take equal shares; rows
    without an item hold zeros, which no split matches; a sequence's splits cover its KV tokens once, the last
    one open-ended); and the work state (int32 `[3]`): how many item rows there are, the counter a persistent
    kernel takes units with (0; the kernel leaves it at 0, so launches of one plan must run one after another, as
    a model's layers do: two at once on different streams would skip units) and the units' order (ORDER_WAVES,
    ORDER_TAKEN for a ragged batch, ORDER_SHARES)."""

    counts: torch.Tensor
    work: torch.Tensor
    work_state: torch.Tensor


@triton.jit
def _split_counts_for(tiles, tiles_per_split, max_splits):
    """Splits of about `tiles_per_split` KV tiles for sequences of `tiles` (rounded to the nearest), within
    [1, max_splits], then lowered to the splits that `cdiv(tiles, splits)` tiles each fill (none empty)."""
    splits = (tiles + tiles_per_split // 2) // tiles_per_split
    splits = tl.minimum(tl.maximum(splits, 1), max_splits)
    return tl.maximum(tl.cdiv(tiles, tl.maximum(tl.cdiv(tiles, splits), 1)), 1)


@triton.jit
def _programs_needed(splits, row_tiles, seq_work):
    """The programs the busy sequences' splits take: splits x row tiles, summed."""
    return tl.sum(tl.where(seq_work > 0, splits * row_tiles, 0), 0)


@triton.jit
def _fitted_splits(tiles, row_tiles, seq_work, tiles_per_split, max_splits, capacity):
    """Splits of about `tiles_per_split` tiles, longer by sixteenths until the busy sequences' units fit `capacity`
    programs or every busy sequence has one split."""
    splits = _split_counts_for(tiles, tiles_per_split, max_splits)
    needed = _programs_needed(splits, row_tiles, seq_work)
    while (needed > capacity) & (tl.max(tl.where(seq_work > 0, splits, 1), 0) > 1):
        tiles_per_split += tl.maximum(tiles_per_split // 16, 1)
        splits = _split_counts_for(tiles, tiles_per_split, max_splits)
        needed = _programs_needed(splits, row_tiles, seq_work)
    return splits


@triton.jit
def _makespan(splits, tiles, row_tiles, seq_work, programs, unit_cost):
    """The estimated time of a plan in KV tiles: its waves of programs x (the longest unit's tiles + a unit's fixed
    cost)."""
    waves = tl.cdiv(_programs_needed(splits, row_tiles, seq_work), programs)
    return waves * (tl.max(tl.where(seq_work > 0, tl.cdiv(tiles, splits), 0), 0) + unit_cost)


@triton.jit
def _store_items(WORK, row, taken, sequence, split, splits, first_token, q_tokens, kv_start, kv_end):
    """Work items at plan rows `row` where `taken` (a tile of them; the fields broadcast to its shape)."""
    entry = WORK + row * WORK_FIELDS
    tl.store(entry, tl.broadcast_to(sequence, row.shape), mask=taken)
    tl.store(entry + 1, tl.broadcast_to(split, row.shape), mask=taken)
    tl.store(entry + 2, tl.broadcast_to(splits, row.shape), mask=taken)
    tl.store(entry + 3, tl.broadcast_to(first_token, row.shape), mask=taken)
    tl.store(entry + 4, tl.broadcast_to(q_tokens, row.shape), mask=taken)
    tl.store(entry + 5, tl.broadcast_to(kv_start, row.shape), mask=taken)
    tl.store(entry + 6, tl.broadcast_to(kv_end, row.shape), mask=taken)


@triton.jit
def _equal_shares(tiles, row_tiles, in_batch, offsets, batch, busy, total_tiles, parts, first_tile, min_tiles,
                  max_splits, capacity, piece_cost, programs, plan_row_tiles, SCRATCH):
    """Whether the batch can take equal shares, and their layout (`share_layout`) and estimated span: every sequence
    busy at the plan's row tiles (a share's programs are its row tiles), shares of a split's minimum tiles at least,
    every sequence's pieces within the split ceiling and the rounds within the plan's rows. Returns (shareable,
    first_part, pieces, last_round, span in KV tiles)."""
    at_plan_rows = tl.sum((in_batch & (row_tiles == plan_row_tiles)).to(tl.int32), 0)
    first_part, pieces, last_round = share_layout(first_tile, tiles, offsets, in_batch, batch, total_tiles, parts,
                                                  SCRATCH)
    rounds = tl.max(tl.where(in_batch, last_round, 0), 0) + 1
    shareable = ((busy == batch) & (at_plan_rows == batch) & (total_tiles >= parts * min_tiles)
                 & (programs % plan_row_tiles == 0) & (rounds * parts <= capacity) & (tl.max(pieces, 0) <= max_splits))
    return shareable, first_part, pieces, last_round, tl.cdiv(total_tiles, parts) + rounds * piece_cost


@triton.jit(do_not_specialize=["batch", "programs", "min_tiles", "batched_min_tiles", "max_splits", "capacity",
                               "rows", "unit_cost", "piece_cost", "plan_row_tiles", "forced_splits"])
def _split_counts_kernel(
    SEQLENS, CU_SEQLENS_Q, NUM_SPLITS, WORK, WORK_STATE, batch, programs, min_tiles, batched_min_tiles, max_splits,
    capacity, rows, unit_cost, piece_cost, plan_row_tiles, forced_splits,
    HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_TAIL: tl.constexpr, FIT_ONE_WAVE: tl.constexpr, SHARES: tl.constexpr,
    RAGGED_SHARES: tl.constexpr,
):
    offsets = tl.arange(0, BLOCK_B)
    in_batch = offsets < batch
    tiles = tl.cdiv(tl.load(SEQLENS + offsets, mask=in_batch, other=0), BLOCK_N)
    first_q_token = tl.load(CU_SEQLENS_Q + offsets, mask=in_batch, other=0)
    q_lens = tl.load(CU_SEQLENS_Q + offsets + 1, mask=in_batch, other=0) - first_q_token
    row_tiles = tl.cdiv(q_lens * HEADS, BLOCK_M)
    seq_work = tiles * row_tiles
    work = tl.sum(seq_work, 0)
    busy = tl.sum((seq_work > 0).to(tl.int32), 0)
    ragged = tl.max(seq_work, 0).to(tl.int64) * busy * RAGGED_DEN > work.to(tl.int64) * RAGGED_NUM
    widest = tl.max(tl.where(seq_work > 0, row_tiles, 0), 0)
    ragged_programs = tl.where(widest >= WIDE_ROW_TILES, WIDE_RAGGED_PROGRAMS, RAGGED_PROGRAMS)
    min_tiles = tl.where(busy >= BATCHED_SEQUENCES, batched_min_tiles, min_tiles)
    tiles_per_split = tl.maximum(tl.cdiv(work, tl.where(ragged, ragged_programs * programs, programs)), min_tiles)
    splits = _split_counts_for(tiles, tiles_per_split, max_splits)
    order_mode = tl.where(ragged, ORDER_TAKEN, ORDER_WAVES)
    counts = splits
    # Equal shares' sizes: the batch's tiles (one at least) over one share a group of plan_row_tiles programs.
    total_tiles = tl.maximum(tl.sum(tiles, 0), 1)
    parts = tl.maximum(tl.minimum(programs, plan_row_tiles * capacity) // plan_row_tiles, 1)
    first_tile = tl.cumsum(tiles, 0) - tiles
    first_part = tl.zeros_like(tiles)
    last_round = tl.zeros_like(tiles)
    if FIT_ONE_WAVE:
        # A ragged batch's splits aim at several waves on purpose; any other batch's fit one wave, or up to
        # MAX_PLAN_WAVES where that is estimated shorter, or take equal shares where those are.
        if ragged == 0:
            splits = _fitted_splits(tiles, row_tiles, seq_work, tiles_per_split, max_splits, programs)
            counts = splits
            narrowest = tl.min(tl.where(seq_work > 0, row_tiles, MULTI_WAVE_MIN_ROW_TILES), 0)
            if (unit_cost > 0) & (narrowest >= MULTI_WAVE_MIN_ROW_TILES):
                best = _makespan(splits, tiles, row_tiles, seq_work, programs, unit_cost)
                for waves in tl.static_range(2, MAX_PLAN_WAVES + 1):
                    aimed = tl.maximum(tl.cdiv(work, waves * programs), min_tiles)
                    candidate = _fitted_splits(tiles, row_tiles, seq_work, aimed, max_splits, waves * programs)
                    makespan = _makespan(candidate, tiles, row_tiles, seq_work, programs, unit_cost)
                    shorter = makespan * MULTI_WAVE_MIN_GAIN_DEN < best * (MULTI_WAVE_MIN_GAIN_DEN - 1)
                    splits = tl.where(shorter, candidate, splits)
                    best = tl.where(shorter, makespan, best)
                counts = splits
                if SHARES and BLOCK_B <= MAX_SORTED_BATCH:
                    # Taken where their estimate, a share plus a piece's fixed cost per piece a share runs, is a
                    # sixteenth shorter than the split counts'.
                    shareable, first_part, pieces, last_round, span = _equal_shares(
                        tiles, row_tiles, in_batch, offsets, batch, busy, total_tiles, parts, first_tile, min_tiles,
                        max_splits, capacity, piece_cost, programs, plan_row_tiles, NUM_SPLITS)
                    take = shareable & (span * MULTI_WAVE_MIN_GAIN_DEN < best * (MULTI_WAVE_MIN_GAIN_DEN - 1))
                    counts = tl.where(take, pieces, splits)
                    order_mode = tl.where(take, ORDER_SHARES, order_mode)
        elif RAGGED_SHARES and SHARES and BLOCK_B <= MAX_SORTED_BATCH:
            # Only where the host let it (RAGGED_SHARES: a persistent kernel, the plan's row tiles and a unit cost,
            # `decode_split_counts`), within the plan's `rows`, which leave room for a share's short sequences in
            # rounds of their own.
            shareable, first_part, pieces, last_round, span = _equal_shares(
                tiles, row_tiles, in_batch, offsets, batch, busy, total_tiles, parts, first_tile, min_tiles,
                max_splits, rows, piece_cost, programs, plan_row_tiles, NUM_SPLITS)
            counts = tl.where(shareable, pieces, splits)
            order_mode = tl.where(shareable, ORDER_SHARES, order_mode)
    if forced_splits > 0:  # `decode_split_counts` checked it against the plan's capacity
        counts = tl.full([BLOCK_B], forced_splits, tl.int32)
        order_mode = ORDER_WAVES
    tl.store(NUM_SPLITS + offsets, counts, mask=in_batch)
    # Reduced unconditionally, not in a small runtime `if`: ptxas if-converts such a branch of Triton 3.7's PTX and
    # predicates its warp reductions on the wrong register (NOTES.md, "The plan kernel under Triton 3.7"; the compile
    # test of `make test` finds a predicated one).
    share_items = (tl.max(tl.where(in_batch, last_round, 0), 0) + 1) * parts
    split_items = tl.sum(tl.where(in_batch, counts, 0), 0)
    most_splits = tl.max(counts, 0)  # a share plan's pieces, or splits
    items = tl.where(order_mode == ORDER_SHARES, share_items, split_items)
    unused_from = tl.where(order_mode == ORDER_SHARES, 0, split_items)
    # Unused rows hold zeros (split 0 of 0, which no program takes); a share plan's unused rows lie between its
    # items, so its rows are all cleared before its items are written.
    field = tl.arange(0, WORK_FIELDS_TILE)[None, :]
    for first_unused in range(unused_from, rows, BLOCK_TAIL):
        unused = first_unused + tl.arange(0, BLOCK_TAIL)[:, None]
        tl.store(WORK + unused * WORK_FIELDS + field, tl.zeros([BLOCK_TAIL, WORK_FIELDS_TILE], tl.int32),
                 mask=(unused < rows) & (field < WORK_FIELDS))
    tl.debug_barrier()  # NUM_SPLITS and the cleared rows, stored above by other threads, are read or overwritten below
    tile: tl.constexpr = [BLOCK_B, BLOCK_S]
    lane = tl.arange(0, BLOCK_S)[None, :]
    if order_mode == ORDER_SHARES:
        for first_piece in range(0, most_splits, BLOCK_S):
            piece = tl.broadcast_to(first_piece + lane, tile)
            part = first_part[:, None] + piece
            last = piece == counts[:, None] - 1
            piece_start = tl.maximum(share_bound(part, total_tiles, parts), first_tile[:, None]) - first_tile[:, None]
            piece_end = tl.minimum(share_bound(part + 1, total_tiles, parts), (first_tile + tiles)[:, None])
            piece_round = tl.where(last, last_round[:, None], 0)
            # The persistent kernel takes the rounds in snake order: odd rounds hold the parts mirrored, so that
            # each part stays on its programs.
            _store_items(WORK, piece_round * parts + tl.where(piece_round % 2 == 0, part, parts - 1 - part),
                         in_batch[:, None] & (piece < counts[:, None]), offsets[:, None], piece, counts[:, None],
                         first_q_token[:, None], q_lens[:, None], piece_start * BLOCK_N,
                         tl.where(last, OPEN_KV_END, (piece_end - first_tile[:, None]) * BLOCK_N))
    else:
        if (BLOCK_B <= MAX_SORTED_BATCH) & (forced_splits == 0):
            # Longest-processing-time order: sequences by tiles per split, descending (ties in batch order,
            # sequences without rows last), so the short splits fill in behind the long ones.
            split_tiles = tl.where(seq_work > 0, tl.cdiv(tiles, counts), 0).to(tl.int64)
            key = tl.where(in_batch, split_tiles * 4294967296 + (BLOCK_B - 1 - offsets), -1)
            order = (BLOCK_B - 1 - (tl.sort(key, descending=True) & 4294967295)).to(tl.int32)
        else:
            order = offsets
        # One item per (sequence, split) in that order, so that a program finds its work in one load.
        ordered_splits = tl.load(NUM_SPLITS + order, mask=in_batch, other=0)
        ordered_tiles = tl.cdiv(tl.load(SEQLENS + order, mask=in_batch, other=0), BLOCK_N)
        split_span = (tl.cdiv(ordered_tiles, tl.maximum(ordered_splits, 1)) * BLOCK_N)[:, None]
        first_item = tl.cumsum(ordered_splits, 0) - ordered_splits
        first_token = tl.load(CU_SEQLENS_Q + order, mask=in_batch, other=0)
        q_tokens = tl.load(CU_SEQLENS_Q + order + 1, mask=in_batch, other=0) - first_token
        for first_split in range(0, most_splits, BLOCK_S):
            split = tl.broadcast_to(first_split + lane, tile)
            _store_items(WORK, first_item[:, None] + split, split < ordered_splits[:, None], order[:, None], split,
                         ordered_splits[:, None], first_token[:, None], q_tokens[:, None], split * split_span,
                         tl.where(split == ordered_splits[:, None] - 1, OPEN_KV_END, (split + 1) * split_span))
    tl.store(WORK_STATE, items)
    tl.store(WORK_STATE + 1, 0)  # the persistent kernel's count of units taken, zero between launches
    tl.store(WORK_STATE + 2, order_mode)


def may_share(persistent: bool, unit_cost_tiles: int) -> bool:
    """Whether `decode_split_counts` may give a batch equal shares (which batch takes them is decided on the GPU):
    only for a persistent kernel, with EQUAL_SHARES and a unit cost, where the plan kernel lays shares out right
    (`share_plans_laid_out_right`).

    >>> may_share(True, HOPPER_UNIT_COST_TILES) == share_plans_laid_out_right()
    True
    >>> may_share(False, HOPPER_UNIT_COST_TILES), may_share(True, 0)
    (False, False)
    """
    return persistent and EQUAL_SHARES and unit_cost_tiles > 0 and share_plans_laid_out_right()


def unit_tiles_hint(kv_tokens_hint: int | None, batch: int, row_tiles: int, block_n: int, programs: int) -> int | None:
    """About how many KV tiles of `block_n` tokens a work unit (one row tile of one split of a sequence) holds in a
    batch of `batch` sequences holding `kv_tokens_hint` cached tokens in all (None where the caller gave no hint),
    rounded up: a sequence's mean, or less where the plan splits sequences, taken as filling whole waves of the
    `programs` (the batch's `row_tiles` x tiles over programs x the waves its unsplit units need). The host's
    estimate, for kernel variants that pay only on long units: a uniform batch's plan runs units of this size or,
    where it chooses more waves for a shorter makespan (`decode_split_counts`), about half.

    >>> unit_tiles_hint(64 * 1024, batch=64, row_tiles=4, block_n=64, programs=132)  # 64 x 1024 tokens
    16
    >>> unit_tiles_hint(8 * 16384, batch=8, row_tiles=4, block_n=64, programs=132)  # split 4 ways or more
    63
    >>> unit_tiles_hint(None, batch=4, row_tiles=4, block_n=64, programs=132) is None
    True
    """
    if kv_tokens_hint is None:
        return None
    tiles = -(-kv_tokens_hint // block_n)
    programs = max(1, programs)
    waves = max(1, -(-batch * row_tiles // programs))
    return min(-(-tiles // max(1, batch)), -(-tiles * row_tiles // (programs * waves)))


def share_plans_laid_out_right(version: str | None = None) -> bool:
    """Whether this process's plan kernel lays equal shares out right: under the CPU interpreter, or built by a Triton
    `version` (the installed one by default) of SHARE_PLAN_TRITONS.

    >>> share_plans_laid_out_right("3.9.0"), share_plans_laid_out_right("3.10.0") == bool(INTERPRET)
    (True, True)
    """
    return bool(INTERPRET) or (version or triton.__version__).startswith(SHARE_PLAN_TRITONS)


def decode_split_counts(
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    heads: int,
    geometry: SplitGeometry,
    block_m: int,
    block_n: int,
    num_sms: int,
    programs_per_sm: int = 2,
    min_tokens_per_split: int = 1,
    batched_min_tokens_per_split: int | None = None,
    unit_cost_tiles: int = 0,
    piece_cost_tiles: int | None = None,
    forced_splits: int = 0,
    persistent: bool = False,
) -> SequenceSplits:
    """int32 `[batch]` splits per sequence, the work items and the work state (`SequenceSplits`), from
    one kernel launch and no host sync.

    A sequence's work is its KV tiles times its row tiles (its query tokens x `heads` rows
    over `block_m`); each split holds about the same number of KV tiles: the batch's work
    over the programs_per_sm x SMs programs that run at once, or over twice as many when
    the batch is ragged (its busiest sequence has more than 1.25x the mean work of the
    non-empty ones; four times where a sequence spans 4 row tiles or more), so that the long
    sequences' splits do not run alone at the end. A
    sequence's split count is rounded to the nearest whole number; where the batch is not ragged and its counts
    would need more programs (splits x row tiles over the busy sequences) than run at once, the splits grow by
    sixteenths until they fit or every busy sequence has one split (`FIT_SPLITS_TO_ONE_WAVE`); with
    `unit_cost_tiles` > 0 (a unit's fixed cost in KV tiles) and busy sequences of two row tiles or more, two or three
    waves' counts replace them where waves x (a unit's tiles + that cost) is a sixteenth smaller or more. Where a
    `persistent` kernel runs the plan (its programs walk their shares' rounds; a grid kernel's program a row would
    start a share plan's rows in their order, long pieces late), with `EQUAL_SHARES` equal shares of the batch's
    tiles replace them where their estimate, a share + `piece_cost_tiles` (default: the unit cost) per round of
    pieces, is a sixteenth smaller (every sequence busy at `geometry.row_tiles`; `decode_share_plan`),
    and a ragged batch busy at two row tiles or more takes them wherever they fit (RAGGED_EQUAL_SHARES;
    `may_share` says on the host whether a plan can take them). A split
    holds at least `min_tokens_per_split` tokens, so its partial output (rows x kv_lora_rank values,
    written and read again by the combine) stays small next to the KV it reads, and at least
    `batched_min_tokens_per_split` (default: the same) where BATCHED_SEQUENCES sequences or more have work,
    whose splits spread the batch over the SMs rather than one sequence's keys; the count is then
    lowered to the splits that `cdiv(tiles, splits)` tiles each actually fill (no empty split). The
    work items list every split of every sequence, sequences by tiles per split, longest first
    (batches up to MAX_SORTED_BATCH; larger ones in batch order), so that the split kernel's programs
    start longest first (simulated on the ragged benchmark batch at 128 heads: a makespan of 1.30x the
    even share in batch order, 1.16x in this order; benchmarks/NOTES.md, v21), and the items come
    before the unused rows, so that no program waits behind programs that find no work (v30); an equal-share
    plan's items come in rounds of one row a share, rows of shares with fewer pieces left empty. `forced_splits` > 0
    gives every sequence that many splits instead (empty ones too; `geometry.max_splits` at least), items in batch
    order (ORDER_WAVES).

    Example (on a CUDA tensor, or on CPU under TRITON_INTERPRET=1): lengths [4096, 4096, 0],
    one query token per sequence, 64 heads in 64-row tiles, 4 SMs x 2 programs, 64-token
    tiles and a ceiling of 16 give `[4, 4, 1]`, sequences in order `[0, 1, 2]`: 128 tiles over 8 programs
    is 16 tiles per split (9 items: the 4 splits of sequence 0, those of 1, the one of 2); lengths
    [4096, 64, 0] are ragged and give `[13, 1, 1]`: 65 tiles over 16 programs is 5 tiles per split.
    """
    if not 0 <= forced_splits <= geometry.max_splits:
        raise ValueError(f"forced_splits: expected 0 (none) to the split ceiling {geometry.max_splits}, "
                         f"got {forced_splits}")
    batch = cache_seqlens.shape[0]
    capacity = batch * geometry.max_splits
    shares = may_share(persistent, unit_cost_tiles)
    ragged_shares = (shares and RAGGED_EQUAL_SHARES
                     and geometry.row_tiles >= MULTI_WAVE_MIN_ROW_TILES.value)
    rows = capacity * RAGGED_SHARE_ROWS if ragged_shares and capacity * RAGGED_SHARE_ROWS <= MAX_WORK_ROWS else capacity
    num_splits = torch.empty(batch, dtype=torch.int32, device=cache_seqlens.device)
    work = torch.empty(rows, WORK_FIELDS, dtype=torch.int32, device=cache_seqlens.device)
    work_state = torch.empty(3, dtype=torch.int32, device=cache_seqlens.device)
    block_b = max(16, triton.next_power_of_2(batch))
    _split_counts_kernel[(1,)](
        cache_seqlens, cu_seqlens_q, num_splits, work, work_state, batch, programs_per_sm * num_sms,
        max(1, -(-min_tokens_per_split // block_n)),
        max(1, -(-(batched_min_tokens_per_split or min_tokens_per_split) // block_n)), geometry.max_splits, capacity,
        rows,
        unit_cost_tiles, unit_cost_tiles if piece_cost_tiles is None else piece_cost_tiles, geometry.row_tiles,
        forced_splits,
        HEADS=heads, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_B=block_b,
        BLOCK_S=max(1, WORK_STORE_TILE // block_b), BLOCK_TAIL=256, FIT_ONE_WAVE=FIT_SPLITS_TO_ONE_WAVE,
        SHARES=shares, RAGGED_SHARES=ragged_shares, **COMPILE_OPTIONS,
    )
    return SequenceSplits(num_splits, work, work_state)
