"""Hopper (SM90) MLA decode for fp8 caches and few query rows, in Gluon: the problem transposed.

With up to 32 query rows (16 heads, one or two draft tokens), the 64-row tiles of
`hopper_decode` pad the MMAs and its fp8 kernel converts every tile into a 16-bit
shared-memory copy. Here the KV tokens are the MMA's M dimension and 16 query rows its N:
S^T = K . Q^T and O^T = V^T . P^T, one warpgroup per program, two programs per SM (a
sequence of 17-32 rows takes two programs side by side, the second reading its tiles from
L2; or, with e4m3 scores on a batch the plan was told is large, one program of 32 rows, E4M3_ROWS).
K and V are register operands loaded straight from the fp8 tile that TMA brought
(vector loads, e4m3 -> fp16 exactly in registers), so the tile crosses shared memory once
per use and is never written back converted. The MMAs run in fp16: each query row is scaled
by a power of two into fp16's range (exact for bf16 values down to 2^-31 of the row's
largest; smaller ones, which cannot move a score, are rounded), undone in the scores' scale.

Two relabellings make the register loads up to 16 bytes wide: the reduction columns of each
K chunk are permuted, and Q's columns are stored permuted the same way (the dot product does
not care); the latent rows of O^T are permuted so that each thread's rows are adjacent cache
columns, and put back in order before the output store (a register relabelling too).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mlakit.kernels.gluon_compat import thread_barrier, tma_load
from mlakit.kernels.hopper_common import (
    BLOCK_N,
    E4M3_QUERY_EXPONENT,
    FP16_QUERY_EXPONENT,
    KV_LORA_RANKS,
    ROPE_DIMS,
    finish_rows,
    grid_work,
    no_keys_yet,
    online_softmax,
    query_row_factor,
    row_descriptors,
    serves,
    split_range,
    store_lse,
    store_output,
    wgmma_k,
    zero_rows_from,
)
from mlakit.kernels.seesaw_layout import DEEPSEEK_WIDTHS
from mlakit.cache.kv_quant import FP8_DTYPE, SCALE_PER_TENSOR
from mlakit.kernels.l2_evict_first import HintedKey, evict_first_tma_loads, mark_evict_first, streams_evict_first
from mlakit.kernels.launch import CachedLaunch

ROWS = gl.constexpr(16)
# With S on 8-bit tensor cores (DeepSeek's widths) a sequence of 17-32 rows may take one tile of this many rows, each
# KV tile read and multiplied once instead of by two 16-row programs: the plan takes it where the caller's hint of the
# batch's cached tokens gives each program WIDE_MIN_TILES_PER_PROGRAM KV tiles or more (`triton_decode`; H100: 16h q2
# 8-25% faster on 64 x 4096 to 128 x 16384; at 6-12 tiles a program 1.4-23% faster since v83 / v84; below 6 up to 11%
# slower on some batches (17% below 3), whose programs it halves; NOTES.md v65, v81, v85). With fp16 MMAs two 16-row
# tiles (v47: a 32-row tile spills).
E4M3_ROWS = gl.constexpr(32)
WIDE_MIN_TILES_PER_PROGRAM = 6
# Sequences with more query rows than this take the 64-row kernels (measured: two 16-row tiles beat one
# 32-row tile of two warpgroups at 32 rows, four lost to the 64-row kernel at 64; NOTES.md v27).
MAX_ROWS = 32
STAGES = gl.constexpr(2)
PROGRAMS_PER_SM = 2
NUM_WARPS = 4
LATENT_CHUNK = gl.constexpr(128)
PV_TOKENS = gl.constexpr(16)
# A tail tile's rows past the end, zeroed 16 bytes per thread.
ZEROING_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))


def supports(q_dtype: torch.dtype, pages: torch.Tensor, scale_mode: int, kv_lora_rank: int, rope_dim: int) -> bool:
    """Whether the narrow kernel takes this call: an SM90 GPU, fp8 pages with one per-tensor scale
    whose page size is 16, 32 or a multiple of 64 (whole TMA boxes per 64-token tile), 16-bit
    queries, a latent width of 64, 128, 256 or 512 and a rope width of 16, 32 or 64."""
    page_size = pages.shape[1]
    return (
        pages.dtype == FP8_DTYPE
        and serves(pages.device, pages.dtype)
        and scale_mode == SCALE_PER_TENSOR
        and q_dtype in (torch.bfloat16, torch.float16)
        and (page_size in (16, 32) or page_size % BLOCK_N.value == 0)
        and kv_lora_rank in KV_LORA_RANKS
        and rope_dim in ROPE_DIMS
    )


def prepare(key: Hashable, grid: tuple[int, int], q: torch.Tensor, pages: torch.Tensor, kv_lora_rank: int,
            e4m3_scores: bool = False, rows: int = ROWS.value
            ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, tuple], None]:
    """The split pass of one input layout (a call `supports` accepts) over tiles of `rows` query rows (ROWS, or
    E4M3_ROWS where `takes_rows` says so): `run(q, pages, kv_scale, shared_args)`, with `key`, `shared_args` and
    `e4m3_scores` (at DeepSeek's 512 + 64 widths: S^T on 8-bit tensor cores over the cache's boxes and Q rounded to
    e4m3) as for `hopper_decode.prepare`."""
    rope_dim = pages.shape[-1] - kv_lora_rank
    boxes = tma_boxes(pages.shape[1], kv_lora_rank, rope_dim)
    evict_first = streams_evict_first(grid[0])
    e4m3 = e4m3_scores and (kv_lora_rank, rope_dim) == DEEPSEEK_WIDTHS
    constants = dict(HEADS=q.shape[1], PAGE_SIZE=pages.shape[1], KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim,
                     ROWS=rows, EVICT_FIRST=evict_first, E4M3_SCORES=e4m3, num_warps=NUM_WARPS)
    # The hint follows from the row tiles and a module setting (an experiment's): named in the key.
    narrow_key = HintedKey((key, e4m3), evict_first)

    def run(q, pages, kv_scale, shared_args) -> None:
        NARROW(narrow_key, (*grid, 1), (q, *row_descriptors(pages, boxes), kv_scale, *shared_args), constants)

    return run


def takes_rows(rows: int, kv_lora_rank: int, rope_dim: int, e4m3_scores: bool) -> bool:
    """Whether the kernel takes row tiles of `rows`: ROWS always, E4M3_ROWS with e4m3 scores at DeepSeek's widths
    (where its S runs on 8-bit tensor cores; with fp16 MMAs a 32-row tile spills, NOTES.md v47).

    >>> takes_rows(32, 512, 64, True), takes_rows(32, 512, 64, False), takes_rows(32, 256, 32, True)
    (True, False, False)
    >>> takes_rows(16, 256, 32, False)
    True
    """
    wide = rows == E4M3_ROWS.value and e4m3_scores and (kv_lora_rank, rope_dim) == DEEPSEEK_WIDTHS
    return rows == ROWS.value or wide


def tma_boxes(page_size: int, kv_lora_rank: int, rope_dim: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The kernel's TMA boxes (rows, columns) of the latent and rope columns: a page's rows at most, a tile's at most.

    >>> tma_boxes(16, 512, 64)
    ((16, 128), (16, 64))
    """
    box_rows = min(page_size, BLOCK_N.value)
    return (box_rows, min(kv_lora_rank, LATENT_CHUNK.value)), (box_rows, rope_dim)


@gluon.constexpr_function
def _transposed_layout(rows, e4m3=False):
    """Register layout of S^T `[BLOCK_N, rows]` and O^T `[kv_lora_rank, rows]` (wgmma accumulators, N = rows; of
    8-bit operands where `e4m3`, whose instructions take 32 columns of K)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, rows, wgmma_k(e4m3)])


@gluon.constexpr_function
def _key_chunk_layout(width):
    """`[BLOCK_N, width]` cache columns as `_relabel_columns` turns them into the wgmma A operand:
    each thread holds two token rows of width / 4 adjacent columns."""
    column_bits = (width // 4).bit_length() - 1
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(column_bits)] + [[8, 0]],
        lane_bases=[[0, width // 4], [0, width // 2], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[BLOCK_N.value, width])


@gluon.constexpr_function
def _adjacent_columns_layout(rows, kv_lora_rank):
    """`[rows, kv_lora_rank]` (16 or 32 rows) with each thread's kv_lora_rank / 32 adjacent columns first among its
    registers, for rows 2t, 2t + 1, 2t + 8, 2t + 9 (and each + 16 at 32 rows): the cache rows of P . V as
    `_relabel_latent` turns them into the wgmma A operand of O^T, and the output rows as `_output_rows` leaves them
    (vector stores)."""
    column_bits = (kv_lora_rank // 32).bit_length() - 1
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(column_bits)] + [[1, 0], [8, 0]] + ([[16, 0]] if rows == 32 else []),
        lane_bases=[[2, 0], [4, 0], [0, kv_lora_rank // 32], [0, kv_lora_rank // 16], [0, kv_lora_rank // 8]],
        warp_bases=[[0, kv_lora_rank // 4], [0, kv_lora_rank // 2]], block_bases=[], shape=[rows, kv_lora_rank])


@gluon.jit
def _relabel_columns(x, WIDTH: gl.constexpr):
    """Columns of each WIDTH-wide chunk of `x [rows, n]` reordered so that a thread's adjacent columns
    (`_key_chunk_layout`) land where the wgmma A operand keeps its reduction index: column
    32q + 4kb + 2h + j of a 128-wide chunk becomes 16kb + 8h + 2q + j."""
    rows: gl.constexpr = x.shape[0]
    chunks: gl.constexpr = x.shape[1] // WIDTH
    x = gl.reshape(x, [rows, chunks, 4, WIDTH // 16, 2, 2])
    x = gl.permute(x, [0, 1, 3, 4, 2, 5])
    return gl.reshape(x, [rows, chunks * WIDTH])


@gluon.jit
def _relabel_latent(v):
    """`v [PV_TOKENS, R]` as the A operand `[R, PV_TOKENS]` of O^T: row g + 8h + 16w + 64rep holds cache
    column h + 2rep + (R / 32)g + (R / 4)w, so each thread's rows are adjacent columns."""
    rank: gl.constexpr = v.shape[1]
    v = gl.reshape(v, [PV_TOKENS, 4, 8, rank // 64, 2])
    v = gl.permute(v, [3, 1, 4, 2, 0])
    return gl.reshape(v, [rank, PV_TOKENS])


@gluon.jit
def _output_rows(acc):
    """O^T `[R, rows]` (latent rows in `_relabel_latent` order) as O `[rows, R]` in cache column order, each
    thread's columns adjacent (vector stores): `_relabel_latent` undone, a register relabelling."""
    rank: gl.constexpr = acc.shape[0]
    rows: gl.constexpr = acc.shape[1]
    acc = gl.reshape(acc, [rank // 64, 4, 2, 8, rows])
    acc = gl.permute(acc, [1, 3, 0, 2, 4])
    return gl.convert_layout(gl.permute(gl.reshape(acc, [rank, rows]), [1, 0]), _adjacent_columns_layout(rows, rank))


@gluon.jit
def _query_rows(Q, tile, first_token, q_len, Q_STRIDES, HEADS: gl.constexpr, ROWS: gl.constexpr,
                KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr):
    """The tile's query rows as loaded (latent and rope columns; rows past the sequence's end are zeros), issued
    before the first tiles' copies so that they do not queue behind them (NOTES.md v82)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q_rows = tile * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    row_ok = (q_rows < q_len * HEADS)[:, None]
    base = (first_token + q_rows // HEADS).to(gl.int64) * Q_STRIDES[0] + (q_rows % HEADS) * Q_STRIDES[1]
    lat_cols = gl.arange(0, KV_LORA_RANK, layout=gl.SliceLayout(0, layout))
    rope_cols = KV_LORA_RANK + gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, layout))
    lat = gl.load(Q + base[:, None] + lat_cols[None, :], mask=row_ok, other=0.0)
    rope = gl.load(Q + base[:, None] + rope_cols[None, :], mask=row_ok, other=0.0)
    return lat, rope


@gluon.jit
def _store_query(q_lat_smem, q_rope_smem, lat, rope, LATENT_WIDTH: gl.constexpr):
    """`_query_rows`' rows scaled per row by a power of two (largest magnitude in [2^14, 2^15)), in fp16 with columns
    relabelled as the K chunks are, or, into e4m3 buffers, rounded to e4m3 with their largest magnitude in [2^7, 2^8)
    and columns in the cache's order; returns the per-row factor undoing it."""
    rope_dim: gl.constexpr = q_rope_smem.shape[1]
    lat = lat.to(gl.float32)
    rope = rope.to(gl.float32)
    amax = gl.maximum(gl.max(gl.abs(lat), 1), gl.max(gl.abs(rope), 1))
    if q_lat_smem.dtype == gl.float8e4nv:
        factor = query_row_factor(amax, E4M3_QUERY_EXPONENT)
        q_lat_smem.store((lat * factor[:, None]).to(gl.float8e4nv))
        q_rope_smem.store((rope * factor[:, None]).to(gl.float8e4nv))
    else:
        factor = query_row_factor(amax, FP16_QUERY_EXPONENT)
        q_lat_smem.store(_relabel_columns((lat * factor[:, None]).to(gl.float16), LATENT_WIDTH))
        q_rope_smem.store(_relabel_columns((rope * factor[:, None]).to(gl.float16), rope_dim))
    return 1.0 / factor


@gluon.jit
def _load_tile(latent_desc, rope_desc, BLOCK_TABLE, bt_row, tok0, end, ready, k_lat, k_rope, pred,
               PAGE_SIZE: gl.constexpr):
    """TMA loads of the 64-token tile at tok0 (whole boxes; a box past the split's end reads the page
    of its last token instead, whose rows past the end are never used) into `k_lat`, `k_rope`."""
    box_rows: gl.constexpr = latent_desc.block_type.shape[0]
    width: gl.constexpr = latent_desc.block_type.shape[1]
    mbarrier.expect(ready, BLOCK_N * (k_lat.shape[1] + k_rope.shape[1]), pred=pred)
    for box in gl.static_range(BLOCK_N // box_rows):
        tok = gl.minimum(tok0 + box * box_rows, end - 1)
        row = gl.load(BLOCK_TABLE + bt_row + tok // PAGE_SIZE, mask=pred, other=0) * PAGE_SIZE + tok % PAGE_SIZE
        for c in gl.static_range(k_lat.shape[1] // width):
            tma_load(latent_desc, [row, c * width], ready,
                     k_lat.slice(box * box_rows, box_rows, dim=0).slice(c * width, width, dim=1),
                     pred=pred)
        tma_load(rope_desc, [row, k_lat.shape[1]], ready,
                 k_rope.slice(box * box_rows, box_rows, dim=0), pred=pred)


@gluon.jit
def _key_operand(chunk, A_LAYOUT: gl.constexpr):
    """One fp8 K chunk `[BLOCK_N, width]` from shared memory as the fp16 A operand of S^T."""
    width: gl.constexpr = chunk.shape[1]
    k = chunk.load(_key_chunk_layout(width)).to(gl.float16)
    return gl.convert_layout(_relabel_columns(k, width), A_LAYOUT)


@gluon.jit
def _transposed_scores(k_lat, k_rope, q_lat_smem, q_rope_smem, s_zero, LATENT_WIDTH: gl.constexpr):
    """S^T = K . Q^T `[BLOCK_N, rows]` of one tile, chunk by chunk: a chunk loads while the previous
    one's MMA runs (at most two in flight, each holding its register operand). With e4m3 Q buffers the MMAs read the
    fp8 tile from shared memory as it landed, on 8-bit tensor cores."""
    if q_lat_smem.dtype == gl.float8e4nv:
        s = warpgroup_mma(k_lat, q_lat_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(k_rope, q_rope_smem.permute((1, 0)), s, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=[s])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_zero.type.layout, k_width=2)
    s = s_zero
    for c in gl.static_range(k_lat.shape[1] // LATENT_WIDTH):
        a = _key_operand(k_lat.slice(c * LATENT_WIDTH, LATENT_WIDTH, dim=1), a_layout)
        s = warpgroup_mma(a, q_lat_smem.slice(c * LATENT_WIDTH, LATENT_WIDTH, dim=1).permute((1, 0)), s,
                          use_acc=c > 0, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=[s])
    a = _key_operand(k_rope, a_layout)
    s = warpgroup_mma(a, q_rope_smem.permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=[s])


@gluon.jit
def _accumulate_values(acc, k_lat, p_smem):
    """acc += V^T . P^T over the tile, PV_TOKENS tokens per MMA."""
    rank: gl.constexpr = k_lat.shape[1]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    v_layout: gl.constexpr = _adjacent_columns_layout(PV_TOKENS.value, rank)
    for step in gl.static_range(BLOCK_N // PV_TOKENS):
        v = k_lat.slice(step * PV_TOKENS, PV_TOKENS, dim=0).load(v_layout).to(gl.float16)
        a = gl.convert_layout(_relabel_latent(v), a_layout)
        acc = warpgroup_mma(a, p_smem.slice(step * PV_TOKENS, PV_TOKENS, dim=0), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
    return warpgroup_mma_wait(num_outstanding=0, deps=[acc])


@gluon.jit(do_not_specialize=["stride_bt_b"])
def mla_decode_hopper_narrow_fp8_kernel(
    Q, LATENT_DESC, ROPE_DESC, KV_SCALE, BLOCK_TABLE, SEQLENS, WORK,
    OUT, LSE, PART_OUT, PART_LSE,
    scale_log2,
    Q_STRIDES, KV_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr,
    ROWS: gl.constexpr, EVICT_FIRST: gl.constexpr, E4M3_SCORES: gl.constexpr,
):
    """One warpgroup per (sequence, ROWS-row tile, split), STAGES tiles in flight, over an fp8 (e4m3) cache
    with the one-element per-tensor scale KV_SCALE, read through the TMA descriptors of `launch` (with
    EVICT_FIRST under an L2 evict-first policy, `l2_evict_first`; with E4M3_SCORES S^T on 8-bit tensor cores, Q
    rounded to e4m3). Other arguments as
    `hopper_decode.mla_decode_hopper_split_kernel`'s (KV_STRIDES unused: the descriptors hold them)."""
    if EVICT_FIRST:
        mark_evict_first()
    b, split, num_splits, first_token, q_len, tile, idle = grid_work(WORK, ROWS, HEADS)
    if idle:
        return
    seqlen = gl.load(SEQLENS + b)
    start, end, num_tiles = split_range(WORK, gl.program_id(1), seqlen)
    latent_width: gl.constexpr = LATENT_DESC.block_type.shape[1]
    layout: gl.constexpr = _transposed_layout(ROWS)
    s_layout: gl.constexpr = _transposed_layout(ROWS, E4M3_SCORES)
    q_dtype: gl.constexpr = gl.float8e4nv if E4M3_SCORES else gl.float16

    fp8_lat_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, latent_width], gl.float8e4nv)
    fp8_rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], gl.float8e4nv)
    k_lat_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, KV_LORA_RANK], fp8_lat_layout)
    k_rope_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, ROPE_DIM], fp8_rope_layout)
    q_lat_smem = gl.allocate_shared_memory(q_dtype, [ROWS, KV_LORA_RANK],
                                           gl.NVMMASharedLayout.get_default_for([ROWS, KV_LORA_RANK], q_dtype))
    q_rope_smem = gl.allocate_shared_memory(q_dtype, [ROWS, ROPE_DIM],
                                            gl.NVMMASharedLayout.get_default_for([ROWS, ROPE_DIM], q_dtype))
    p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, ROWS],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROWS], gl.float16))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)

    q_lat, q_rope = _query_rows(Q, tile, first_token, q_len, Q_STRIDES, HEADS, ROWS, KV_LORA_RANK, ROPE_DIM)
    bt_row = b * stride_bt_b
    for st in gl.static_range(STAGES):
        _load_tile(LATENT_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, start + st * BLOCK_N, end, ready.index(st),
                   k_lat_smem.index(st), k_rope_smem.index(st), st < num_tiles, PAGE_SIZE)
    kv_scale = gl.load(KV_SCALE)
    unscale = _store_query(q_lat_smem, q_rope_smem, q_lat, q_rope, latent_width)
    fence_async_shared()
    thread_barrier()

    rows = tile * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, s_layout))
    visible = seqlen - q_len + rows // HEADS + 1
    row_scale = gl.convert_layout(unscale, gl.SliceLayout(0, s_layout)) * (scale_log2 * kv_scale)
    m_i, l_i = no_keys_yet(ROWS, gl.SliceLayout(0, s_layout))
    acc = gl.zeros([KV_LORA_RANK, ROWS], gl.float32, layout=layout)
    s_zero = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=s_layout)
    for t in range(num_tiles):
        tok0 = start + t * BLOCK_N
        stage = t % STAGES
        mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
        k_lat = k_lat_smem.index(stage)
        if tok0 + BLOCK_N > end:
            # TMA brought whole page rows: those past the end may hold anything, NaN included.
            zero_rows_from(k_lat, end - tok0, latent_width, ZEROING_LAYOUT)
            thread_barrier()
        s = _transposed_scores(k_lat, k_rope_smem.index(stage), q_lat_smem, q_rope_smem, s_zero, latent_width)
        toks = tok0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
        s = gl.where((toks[:, None] < end) & (toks[:, None] < visible[None, :]), s * row_scale[None, :],
                     float("-inf"))
        p, alpha, m_i = online_softmax(s, m_i, 0)
        l_i = l_i * alpha + gl.sum(p, 0)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, layout))[None, :]
        p_smem.store(p.to(gl.float16))
        fence_async_shared()
        thread_barrier()
        acc = _accumulate_values(acc, k_lat, p_smem)
        fence_async_shared()
        thread_barrier()
        _load_tile(LATENT_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, tok0 + STAGES * BLOCK_N, end, ready.index(stage),
                   k_lat, k_rope_smem.index(stage), t + STAGES < num_tiles, PAGE_SIZE)

    lse, inv_l = finish_rows(m_i, l_i)
    if PART_OUT.dtype.element_ty == gl.float16:
        # fp16 partials stay in the cache's units: the combine scales the merged rows (`triton_decode`).
        out_scale = gl.where(num_splits == 1, kv_scale, 1.0)
    else:
        out_scale = kv_scale
    out = _output_rows(acc * gl.convert_layout(inv_l * out_scale, gl.SliceLayout(0, layout))[None, :])
    out_rows = tile * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, out.type.layout))
    cols = gl.arange(0, KV_LORA_RANK, layout=gl.SliceLayout(0, out.type.layout))
    store_output(out, out_rows[:, None], cols[None, :], OUT, PART_OUT, first_token, b, split, num_splits, q_len,
                  OUT_STRIDES, PART_STRIDES, HEADS)
    store_lse(lse, rows, LSE, PART_LSE, first_token, b, split, num_splits, q_len, LSE_STRIDES, PART_STRIDES, HEADS)


NARROW = CachedLaunch(mla_decode_hopper_narrow_fp8_kernel, ptx_rewrite=evict_first_tma_loads)
