"""The seesaw's L2 prefetch of a program's next unit: its query rows and the cache rows of its first two KV tiles,
asked of L2 by bulk prefetches a tile pair or more before this unit's end, so that the next unit's prologue reads them
from L2 instead of HBM. In a batch whose programs all change units at once (a uniform batch), those prologues are one
burst of HBM reads while the tensor cores idle (NOTES.md v89, v90). A prefetch is a hint: it changes no value.
The seesaw takes it over fp8 pages only (`dispatch.prefetch_pairs`): over 16-bit pages the prefetches slowed the tile
loops they ran under by more than the next prologue saved."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from mlakit.kernels.hopper_common import BLOCK_N, split_range
from mlakit.kernels.hopper_decode.constants import BLOCK_M

# One piece per thread of a warpgroup: the tile's BLOCK_M query rows, then the two KV tiles in pieces of two rows.
PIECES = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))
PIECE_COUNT = gl.constexpr(128)
KV_ROWS_PER_PIECE = gl.constexpr(2)
# A piece's address as an integer, 0 for none (a partition takes no pointer tensors, and tensors only through shared
# memory). Bulk prefetches take 16-byte aligned addresses and sizes: an unaligned address is skipped, the sizes are
# checked where they are made.
_PREFETCH_ASM = gl.constexpr("""{
 .reg .pred ok, aligned;
 .reg .b64 low;
 and.b64 low, $1, 15;
 setp.eq.u64 aligned, low, 0;
 setp.ne.and.u64 ok, $1, 0, aligned;
 @ok cp.async.bulk.prefetch.L2.global [$1], $2;
 mov.u32 $0, 0;
}""")


@gluon.jit
def allocate_pieces():
    """Shared memory for one unit's piece addresses (`stage_next_unit`, `prefetch_to_l2`)."""
    return gl.allocate_shared_memory(gl.int64, [PIECE_COUNT], gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.jit
def stage_next_unit(pieces, Q, KV, BLOCK_TABLE, WORK, next_work, item, tile, runs, Q_STRIDES, kv_row_stride,
                    stride_bt_b, HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Stores into `pieces` the addresses of the next unit's pieces: query row tile `tile` of work item `item`
    (`next_work` its `_unit_work`) and the cache rows of its first two KV tiles (pages hold whole tiles); all 0
    unless `runs`.

    A seesaw program calls it behind its unit's own loads, for the unit it takes next; its warpgroup 1 then calls
    `prefetch_to_l2(pieces, ...)` inside the unit's tile loop.
    """
    gl.static_assert(BLOCK_M + 2 * BLOCK_N // KV_ROWS_PER_PIECE == PIECE_COUNT, "one piece per thread of a warpgroup")
    b, split, num_splits, first_token, q_len, seqlen = next_work
    piece = gl.arange(0, PIECE_COUNT, layout=PIECES)
    stride_q_tok, stride_q_head = Q_STRIDES
    q_row = tile * BLOCK_M + gl.minimum(piece, BLOCK_M - 1)
    q_address = Q + (first_token + q_row // HEADS).to(gl.int64) * stride_q_tok + (q_row % HEADS) * stride_q_head
    in_q = runs & (piece < BLOCK_M) & (q_row < q_len * HEADS)

    start, end, num_tiles = split_range(WORK, item, seqlen)
    kv_piece = gl.maximum(piece - BLOCK_M, 0)
    kv_tile = kv_piece // (BLOCK_N // KV_ROWS_PER_PIECE)
    token = start + kv_tile * BLOCK_N + kv_piece % (BLOCK_N // KV_ROWS_PER_PIECE) * KV_ROWS_PER_PIECE
    in_kv = runs & (piece >= BLOCK_M) & (kv_tile < num_tiles)
    page = gl.load(BLOCK_TABLE + b * stride_bt_b + token // PAGE_SIZE, mask=in_kv, other=0)
    kv_address = KV + (page.to(gl.int64) * PAGE_SIZE + token % PAGE_SIZE) * kv_row_stride
    addresses = gl.where(in_q, q_address.to(gl.int64, bitcast=True),
                         gl.where(in_kv, kv_address.to(gl.int64, bitcast=True), 0))
    pieces.store(addresses)


@gluon.jit
def prefetch_to_l2(pieces, Q_ROW_BYTES: gl.constexpr, KV_ROW_BYTES: gl.constexpr):
    """A bulk L2 prefetch of each piece `stage_next_unit` stored (a query row, or two cache rows: the second's tail is
    not asked for where the cache pads its rows)."""
    gl.static_assert(Q_ROW_BYTES % 16 == 0 and KV_ROWS_PER_PIECE * KV_ROW_BYTES % 16 == 0, "16-byte sizes")
    piece = gl.arange(0, PIECE_COUNT, layout=PIECES)
    sizes = gl.where(piece < BLOCK_M, Q_ROW_BYTES, KV_ROWS_PER_PIECE * KV_ROW_BYTES)
    gl.inline_asm_elementwise(_PREFETCH_ASM, "=r,l,r", [pieces.load(PIECES), sizes], dtype=gl.int32, is_pure=False,
                              pack=1)
