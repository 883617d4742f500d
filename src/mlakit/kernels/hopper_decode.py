"""Hopper (SM90) MLA decode split kernels in Gluon, with the work split by warpgroup.

Drop-ins for the portable split kernel on 64-row tiles (same split plan, partial buffers
and combine). Two warpgroups work on 64 query rows and one split of a sequence's KV at a
time (one program per such unit, or, for the persistent seesaw kernel, one program per SM
taking units in turn); Q and two stages of the 64-token K tile (latent + rope) live in swizzled
shared memory, and V is the latent part of the same tile. Three kernels:

- `mla_decode_hopper_seesaw_kernel`, for 16-bit pages holding whole tiles (page size a
  multiple of 64): the two warpgroups take turns over pairs of tiles. Warpgroup 0 computes S
  and the softmax of the even tiles, warpgroup 1 those of the odd tiles (while warpgroup 0's
  softmax runs), against one running max handed over through shared memory (on named barriers:
  the giving warpgroup arrives and goes on, the taking one waits); each owns half of
  the output columns, multiplies its own P from registers and the other's from shared memory.
  Tiles arrive as two halves of the latent columns, one TMA copy and one barrier each, and the
  rope on a third (S starts on the first half; a split's partial 16-bit last tile waits for all of
  them, to zero its rows past the end); each half is reloaded as soon as its last reader is done
  with it. P goes into the tile's rope columns, which S no longer needs. For batches that fill
  the GPU (few split sequences) the program that finishes a sequence's last split merges its
  partials, so no combine kernel runs.
  It also takes fp8 (e4m3) pages with one per-tensor scale at 512 + 64 widths: each chunk's fp8
  box lands in the first half of the chunk's 16-bit place and is converted there to fp16, half a
  tile at a time, by the warpgroup whose S reads it first (rows past the split's end zeroed as they
  go); its MMAs then run in fp16, query rows scaled per row into fp16's range;
- `mla_decode_hopper_fp8_kernel`, for other fp8 (e4m3) pages with one per-tensor scale (any size):
  warpgroup 0 computes S for the whole tile, the softmax, and writes P and the row rescale
  factors to shared memory; both warpgroups then do P . V for half of the latent columns each.
  The value warpgroup gathers the tile three ahead into registers, converts the one two ahead
  to the query's dtype and stores it into the stage it frees (the scale is folded into the
  scores and the output);
- `mla_decode_hopper_split_kernel`, for other 16-bit pages: rows gathered with `cp.async`
  one tile ahead (tokens past the split's end zero-filled), S split between the
  warpgroups over the tile's tokens, P . V over half of the latent columns each.

Otherwise queries and KV share one 16-bit dtype. The latent width is 64, 128, 256 or 512
(the seesaw kernel needs two chunks: 64 goes to the cp.async kernel), the rope width 16,
32 or 64. The CPU interpreter does not run Gluon: the portable kernel serves there and
everywhere else.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from triton.experimental import gluon
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mlakit.kernels.hopper_common import (
    BLOCK_N,
    DEEPSEEK_WIDTHS,
    E4M3_QUERY_EXPONENT,
    FP16_QUERY_EXPONENT,
    GLUON_DTYPES,
    KV_LORA_RANKS,
    ROPE_DIMS,
    TensorAddress,
    finish_rows,
    hand_over,
    launch_dependents,
    no_keys_yet,
    online_softmax,
    query_row_factor,
    remember,
    row_descriptors,
    row_piece_layout,
    staged_in_row_pieces,
    serves,
    split_range,
    store_lse,
    store_output,
    take_over,
    take_unit,
    wgmma_k,
    work_item,
    zero_rows_from,
)
from mlakit.device import sm_count
from mlakit.cache.kv_quant import FP8_DTYPE, SCALE_PER_TENSOR
from mlakit.kernels.l2_evict_first import evict_first_tma_loads, mark_evict_first, streams_evict_first
from mlakit.kernels.launch import CachedLaunch

BLOCK_M = gl.constexpr(64)
NUM_WARPS = gl.constexpr(8)
STAGES = gl.constexpr(2)
TMA_CHUNK = gl.constexpr(64)
# Hardware named barriers for the seesaw's hand-offs between its two warpgroups (the compiler takes
# barriers 0-2 for its own synchronization in a two-partition kernel).
EVEN_MAX_READY = gl.constexpr(10)
ODD_MAX_READY = gl.constexpr(11)
EVEN_P_READY = gl.constexpr(12)
ROW_SUMS_READY = gl.constexpr(13)
RIGHT_VALUES_ISSUED = gl.constexpr(14)
# One warpgroup's rows in 16-byte pieces (query loads, zeroing the rows past a sequence's end).
WARPGROUP_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
# The persistent seesaw merges its split sequences' partials itself when the plan has at most this many
# splits per sequence: batches that fill the GPU, whose few split sequences are merged while the other
# programs work. Beyond it the combine kernel, whose many programs merge faster (NOTES.md v39).
MERGE_MAX_SPLITS = 4
# Its merges: latent columns per step and partials whose loads are in flight together.
MERGE_COLUMNS = gl.constexpr(64)
MERGE_SPLITS_PER_STEP = gl.constexpr(4)
MERGE_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0]))
# A program lets the combine launch past its last unit's tile loop only where that unit's sequence has at most
# this many splits: a combine let launch early behind many splits took 18-32% longer (NOTES.md v59, v60).
EARLY_TRIGGER_MAX_SPLITS = gl.constexpr(32)
# A prepared split pass: run(q, pages, kv_scale, shared_args).
SplitPass = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", tuple], None]
# A warpgroup's share of 64 query columns (16-bit), 16 bytes per thread and row.
QUERY_BLOCK = gl.constexpr(gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0]))
# One warpgroup's words of an fp8 `[BLOCK_N, TMA_CHUNK]` box (16 per row), 16 bytes per thread and row.
FP8_BOX_WORDS = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0]))


def supports(q_dtype: torch.dtype, pages: torch.Tensor, scale_mode: int, kv_lora_rank: int, rope_dim: int) -> bool:
    """Whether the Hopper kernel takes this call: an SM90 GPU; 16-bit queries and pages of the same
    dtype, or fp8 pages with one per-tensor scale; a latent width of 64, 128, 256 or 512 (each
    warpgroup's half of the output is a power-of-two tile) and a rope width of 16, 32 or 64."""
    if pages.dtype == FP8_DTYPE:
        cache_ok = scale_mode == SCALE_PER_TENSOR
    else:
        cache_ok = pages.dtype == q_dtype
    return (
        serves(pages.device, pages.dtype)
        and q_dtype in GLUON_DTYPES
        and cache_ok
        and kv_lora_rank in KV_LORA_RANKS
        and rope_dim in ROPE_DIMS
    )


def chunk_descriptors(pages: torch.Tensor, kv_lora_rank: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of the cache rows `[pages x page_size, dim]` (row-contiguous pages: `rows_are_contiguous`):
    the latent columns half a tile a copy (`half_tile_descriptor`) and `[BLOCK_N, rope_dim]` rope blocks, kept by the
    pages' address, shape, strides and dtype (one lookup a call)."""
    key = (pages.data_ptr(), pages.shape, pages.stride(), pages.dtype, kv_lora_rank)
    found = _CHUNK_DESCRIPTORS.get(key)
    if found is None:
        rope_dim = pages.shape[-1] - kv_lora_rank
        found = remember(_CHUNK_DESCRIPTORS, key, (half_tile_descriptor(pages, kv_lora_rank),
                                                   row_descriptors(pages, ((BLOCK_N.value, rope_dim),))[0]))
    return found


_CHUNK_DESCRIPTORS: dict[tuple, tuple[TensorDescriptor, TensorDescriptor]] = {}


def half_tile_descriptor(pages: torch.Tensor, kv_lora_rank: int) -> TensorDescriptor:
    """The latent columns of the cache rows seen as `[chunks, rows, TMA_CHUNK]` (a chunk's stride is TMA_CHUNK
    elements, a row's the row stride), read in `[chunks / 2, BLOCK_N, TMA_CHUNK]` boxes: one TMA copy lands half a
    tile as the chunk-major blocks the swizzled stage buffer holds (NOTES.md v70). fp8 pages, whose chunks land in
    the first half of their 16-bit blocks (`_fp8_block`), get a size-one dimension before the rows, read two deep:
    TMA fills each block's second half with zeros, which costs no reads (NOTES.md v71)."""
    if kv_lora_rank % (2 * TMA_CHUNK.value):
        raise ValueError(f"kv_lora_rank: expected a multiple of {2 * TMA_CHUNK.value} (whole tile halves), got "
                         f"{kv_lora_rank}")
    rows = pages.reshape(-1, pages.shape[-1])
    chunks = kv_lora_rank // TMA_CHUNK.value
    shape, strides = [chunks, rows.shape[0], TMA_CHUNK.value], [TMA_CHUNK.value, rows.stride(0), 1]
    box = [chunks // 2, BLOCK_N.value, TMA_CHUNK.value]
    swizzle = 128
    if pages.dtype == FP8_DTYPE:
        shape.insert(1, 1)
        strides.insert(1, 16)
        box.insert(1, 2)
        swizzle = 64
    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=rows.element_size() * 8, rank=len(shape))
    return TensorDescriptor(TensorAddress(rows.data_ptr(), rows.dtype), shape, strides, box, layout)


def prepare(key: Hashable, grid: tuple[int, int], q: torch.Tensor, pages: torch.Tensor, kv_lora_rank: int,
            work_state: torch.Tensor, merge_state: torch.Tensor, max_splits: int,
            e4m3_scores: bool = False) -> tuple[SplitPass, bool]:
    """The split pass of one input layout (a call `supports` accepts) over `grid` = (row tiles, rows of the
    plan's work items): the persistent seesaw kernel for pages holding whole tiles (TMA loads) and latent
    widths of at least 128, 16-bit or, at DeepSeek's 512 + 64 widths, fp8 with the one-element
    `kv_scale`: one program per SM at most, over the plan's `work_state`; else the fp8 kernel for fp8
    caches, the cp.async gather kernel for 16-bit ones. `key` fixes how Triton specializes the arguments
    (`CachedLaunch`).

    Returns `run(q, pages, kv_scale, shared_args)`, where `shared_args` are the portable split kernel's
    arguments from the block table on, without the scale strides, and whether the kernel merges the split
    sequences' partials itself (the seesaw, when the plan's split ceiling `max_splits` is at most
    MERGE_MAX_SPLITS, counting splits in the plan's `merge_state`), so that no combine is needed.
    `e4m3_scores`: fp8 pages on the seesaw compute S on 8-bit tensor cores, the query rows rounded to e4m3
    (`E4M3_SCORES`); other kernels ignore it."""
    rope_dim = q.shape[-1] - kv_lora_rank
    constants = dict(HEADS=q.shape[1], PAGE_SIZE=pages.shape[1], KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim)
    fp8 = pages.dtype == FP8_DTYPE
    if _seesaw_takes(pages.shape[1], kv_lora_rank, rope_dim, fp8):
        row_tiles, work_rows = grid
        programs = (min(sm_count(q.device), row_tiles * work_rows), 1, 1)
        merge = 1 < max_splits <= MERGE_MAX_SPLITS
        evict_first = streams_evict_first(row_tiles)
        e4m3 = fp8 and e4m3_scores
        constants.update(MERGE=merge, EVICT_FIRST=evict_first, E4M3_SCORES=e4m3, num_warps=4)
        plan_args = (work_state, work_rows, row_tiles, merge_state)

        # Both follow from the plan and a module setting; named in the key, a kernel compiled under another
        # setting (an experiment's) is never launched in its place.
        seesaw_key = (key, merge, evict_first, e4m3)

        def seesaw(q, pages, kv_scale, shared_args) -> None:
            # 16-bit pages never read KV_SCALE: any tensor fills it.
            SEESAW(seesaw_key, programs, (q, *chunk_descriptors(pages, kv_lora_rank), kv_scale if fp8 else work_state,
                                   *shared_args, *plan_args), constants)

        return seesaw, merge
    launch, constants["num_warps"] = (FP8_SPLIT, 4) if fp8 else (SPLIT, NUM_WARPS.value)

    def split(q, pages, kv_scale, shared_args) -> None:
        launch(key, (*grid, 1), (q, pages, kv_scale, *shared_args) if fp8 else (q, pages, *shared_args), constants)

    return split, False


def _seesaw_takes(page_size: int, kv_lora_rank: int, rope_dim: int, fp8: bool) -> bool:
    """Whether the seesaw kernel serves these pages: whole 64-token tiles per page and at least two latent
    chunks; fp8 only at 512 + 64 (its chunks and rope convert in place as 64-column blocks)."""
    whole_tiles = page_size % BLOCK_N.value == 0 and kv_lora_rank >= 2 * TMA_CHUNK.value
    return whole_tiles and (not fp8 or (kv_lora_rank, rope_dim) == DEEPSEEK_WIDTHS)


def rows_are_contiguous(pages: torch.Tensor) -> bool:
    """Whether `[num_pages, page_size, dim]` pages are one `[rows, dim]` matrix (what TMA reads)."""
    return pages.stride(2) == 1 and pages.stride(0) == pages.shape[1] * pages.stride(1)


@gluon.constexpr_function
def _score_layout(e4m3=False):
    """Register layout of one warpgroup's S tile `[BLOCK_M, BLOCK_N]` (a wgmma accumulator; of 8-bit operands
    where `e4m3`, whose instructions take 32 columns of K)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N.value, wgmma_k(e4m3)])


@gluon.constexpr_function
def _half_output_layout(kv_lora_rank):
    """Register layout of one warpgroup's half of the output `[BLOCK_M, kv_lora_rank / 2]`."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, kv_lora_rank // 2, 16])


@gluon.jit
def _load_query(q_lat_smem, q_rope_smem, Q, tile, first_token, q_len, Q_STRIDES,
                HEADS: gl.constexpr, LAYOUT: gl.constexpr):
    """cp.async of the tile's query rows (row = draft token x HEADS + head; rows past the segment zeros)."""
    rank: gl.constexpr = q_lat_smem.shape[1]
    q_rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LAYOUT))
    q_row_ok = q_rows < q_len * HEADS
    stride_q_tok, stride_q_head = Q_STRIDES
    q_base = (first_token + q_rows // HEADS).to(gl.int64) * stride_q_tok + (q_rows % HEADS) * stride_q_head
    lat_cols = gl.arange(0, rank, layout=gl.SliceLayout(0, LAYOUT))
    rope_cols = gl.arange(0, q_rope_smem.shape[1], layout=gl.SliceLayout(0, LAYOUT))
    async_copy.async_copy_global_to_shared(q_lat_smem, Q + q_base[:, None] + lat_cols[None, :], mask=q_row_ok[:, None])
    async_copy.async_copy_global_to_shared(q_rope_smem, Q + q_base[:, None] + rank + rope_cols[None, :], mask=q_row_ok[:, None])


@gluon.jit
def _allocate_tiles(dtype: gl.constexpr, KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr):
    """Shared memory of one program: Q (latent, rope), STAGES K tiles (latent, rope) and P."""
    lat_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, KV_LORA_RANK], dtype)
    rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, ROPE_DIM], dtype)
    return (
        gl.allocate_shared_memory(dtype, [BLOCK_M, KV_LORA_RANK], lat_layout),
        gl.allocate_shared_memory(dtype, [BLOCK_M, ROPE_DIM], rope_layout),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, KV_LORA_RANK], lat_layout),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, ROPE_DIM], rope_layout),
        gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N],
                                  gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)),
    )


@gluon.jit
def _masked(s, tok0, end, visible):
    """Scores, -inf where a token is past the split's end or not yet visible to the row (their scale goes into
    `online_softmax`'s exponent)."""
    toks = tok0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
    return gl.where((toks[None, :] < end) & (toks[None, :] < visible[:, None]), s, float("-inf"))


@gluon.jit
def _masked_near_end(s, tok0, end, visible, unmasked_end):
    """`_masked` for the tiles that reach past `unmasked_end` (the split's end or the first row's visibility, so the
    earlier tiles are whole for every row): the others pass unchanged, as FlashMLA masks only its last blocks."""
    if tok0 + BLOCK_N > unmasked_end:
        s = _masked(s, tok0, end, visible)
    return s


@gluon.jit
def _tile_rows(tile, seqlen, q_len, end, HEADS: gl.constexpr, LAYOUT: gl.constexpr):
    """A row tile's rows, how many of the sequence's tokens each sees (bottom-right causal: query i of q_len sees
    seqlen - q_len + i + 1), and the end of the tokens every row sees within the split (`_masked_near_end`)."""
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=LAYOUT)
    visible = seqlen - q_len + rows // HEADS + 1
    return rows, visible, gl.minimum(end, seqlen - q_len + tile * BLOCK_M // HEADS + 1)


@gluon.jit
def _masked_scores(q_lat_smem, q_rope_smem, k_lat, k_rope, s_zero, tok0, end, visible):
    """S = Q . K^T of one tile (layout of `s_zero`), unscaled, -inf where a token is past the split's end or
    not yet visible to the row's query token."""
    s = warpgroup_mma(q_lat_smem, k_lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(q_rope_smem, k_rope.permute((1, 0)), s, is_async=True)
    return _masked(warpgroup_mma_wait(num_outstanding=0, deps=[s]), tok0, end, visible)


@gluon.jit
def _row_vector(values, LAYOUT: gl.constexpr):
    """Per-row values (one per query row) in the row layout of `LAYOUT`, e.g. an output accumulator's."""
    return gl.convert_layout(values, gl.SliceLayout(1, LAYOUT))


@gluon.jit
def _gather_rows(smem, KV, BLOCK_TABLE, bt_row, tok0, end, KV_STRIDES,
                 COL_OFFSET: gl.constexpr, WIDTH: gl.constexpr, PAGE_SIZE: gl.constexpr, LAYOUT: gl.constexpr):
    """cp.async of tokens tok0 .. tok0 + BLOCK_N of one sequence (columns COL_OFFSET .. + WIDTH)
    into `smem`; tokens at or past `end` are zero-filled."""
    toks = tok0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LAYOUT))
    tok_ok = toks < end
    page = gl.load(BLOCK_TABLE + bt_row + toks // PAGE_SIZE, mask=tok_ok, other=0).to(gl.int64)
    row_base = page * KV_STRIDES[0] + (toks % PAGE_SIZE) * KV_STRIDES[1] + COL_OFFSET
    cols = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, LAYOUT))
    async_copy.async_copy_global_to_shared(smem, KV + row_base[:, None] + cols[None, :], mask=tok_ok[:, None])


@gluon.jit
def _cache_row(BLOCK_TABLE, bt_row, tok0, PAGE_SIZE: gl.constexpr):
    """Row of the `[pages x page_size, dim]` cache matrix holding token tok0 of the sequence."""
    return gl.load(BLOCK_TABLE + bt_row + tok0 // PAGE_SIZE) * PAGE_SIZE + tok0 % PAGE_SIZE


@gluon.jit
def _load_fp8_tile(KV, BLOCK_TABLE, bt_row, tok0, end, KV_STRIDES, PAGE_SIZE: gl.constexpr,
                   KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr):
    """Registers holding tokens tok0 .. tok0 + BLOCK_N of an fp8 cache (any page size) as int32 words of
    four values, latent and rope columns in 16-byte pieces; zeros at or past `end`, where nothing is read.
    (Words, not fp8 tensors: those hold one value per register.)"""
    lat_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 * 16 // ROPE_DIM, ROPE_DIM // 16], [4, 1], [1, 0])
    return (
        _gather_fp8_words(KV, BLOCK_TABLE, bt_row, tok0, end, KV_STRIDES, 0, KV_LORA_RANK,
                          PAGE_SIZE, lat_layout),
        _gather_fp8_words(KV, BLOCK_TABLE, bt_row, tok0, end, KV_STRIDES, KV_LORA_RANK, ROPE_DIM,
                          PAGE_SIZE, rope_layout),
    )


@gluon.jit
def _gather_fp8_words(KV, BLOCK_TABLE, bt_row, tok0, end, KV_STRIDES, COL0: gl.constexpr,
                      WIDTH: gl.constexpr, PAGE_SIZE: gl.constexpr, LAYOUT: gl.constexpr):
    """Columns COL0 .. COL0 + WIDTH of tokens tok0 .. tok0 + BLOCK_N as `[BLOCK_N, WIDTH // 4]` int32 words,
    each row from its own page."""
    toks = tok0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LAYOUT))
    tok_ok = toks < end
    page = gl.load(BLOCK_TABLE + bt_row + toks // PAGE_SIZE, mask=tok_ok, other=0).to(gl.int64)
    rows = (KV + page * KV_STRIDES[0] + (toks % PAGE_SIZE) * KV_STRIDES[1] + COL0).to(gl.pointer_type(gl.int32),
                                                                                       bitcast=True)
    words = gl.arange(0, WIDTH // 4, layout=gl.SliceLayout(0, LAYOUT))
    return gl.load(rows[:, None] + words[None, :], mask=tok_ok[:, None], other=0)


def _e4m3_pair_to_bf16_ptx(out: str, byte_selector: str) -> str:
    """PTX: two e4m3 bytes of $2 (picked by `byte_selector`) as a bf16 pair in `out`. The byte s.eeee.mmm
    placed by prmt and shifted by 4 is the bf16 s.0000eeee.mmm0000; times 2^120 (0x7B80, in k) it moves
    the exponent bias from 127 to 7: exact for every finite value, subnormals included (the NaN
    byte s.1111.111, which no quantizer writes, comes out as +-480)."""
    return (f"prmt.b32 t, $2, 0, {byte_selector};\nshr.b32 u, t, 4;\nand.b32 u, u, 0x07F007F0;\n"
            f"and.b32 t, t, 0x80008000;\nor.b32 t, t, u;\nmul.rn.bf16x2 {out}, t, k;\n")


# One int32 word of four e4m3 values in, two 16-bit pairs out.
_E4M3_TO_BF16_PAIRS = gl.constexpr("{\n.reg .b32 t, u, k;\nmov.b32 k, 0x7B807B80;\n" + _e4m3_pair_to_bf16_ptx("$0", "0x1404")
                                   + _e4m3_pair_to_bf16_ptx("$1", "0x3424") + "}")
_E4M3_TO_F16_PAIRS = gl.constexpr("""{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}""")


@gluon.jit
def _store_converted(lat, rope, lat_dst, rope_dst, ready):
    """A loaded fp8 tile (int32 words) converted to the stage's dtype and stored into it; `ready` signalled."""
    _store_words_converted(lat, _as_pairs(lat_dst), lat_dst.dtype)
    _store_words_converted(rope, _as_pairs(rope_dst), rope_dst.dtype)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ready, count=1)


@gluon.jit
def _as_pairs(dst):
    """A swizzled 16-bit `[rows, n]` buffer as int32 `[rows, n / 2]`: one word per pair of values."""
    pair_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=dst.layout.swizzle_byte_width,
                                                     element_bitwidth=32, rank=2)
    return dst._reinterpret(gl.int32, [dst.shape[0], dst.shape[1] // 2], pair_layout)


@gluon.jit
def _store_words_converted(words, pairs_dst, dtype: gl.constexpr):
    """fp8 words `[rows, n]` as `dtype` (16-bit) pairs into the int32 `[rows, 2n]` view `pairs_dst`."""
    asm: gl.constexpr = _E4M3_TO_BF16_PAIRS if dtype == gl.bfloat16 else _E4M3_TO_F16_PAIRS
    low, high = gl.inline_asm_elementwise(asm, "=r,=r,r", [words], dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    pairs_dst.store(gl.reshape(gl.join(low, high), [words.shape[0], 2 * words.shape[1]]))


@gluon.jit(do_not_specialize=["stride_bt_b"])
def mla_decode_hopper_split_kernel(
    Q, KV, BLOCK_TABLE, SEQLENS, WORK,
    OUT, LSE, PART_OUT, PART_LSE,
    scale_log2,
    Q_STRIDES, KV_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr,
    KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr,
):
    """Arguments as the portable split kernel's (`triton_decode._mla_decode_split_kernel`), without scales."""
    b, split, num_splits, first_token, q_len = work_item(WORK, gl.program_id(1))
    tile = gl.program_id(0)
    if split >= num_splits or tile * BLOCK_M >= q_len * HEADS:
        return
    seqlen = gl.load(SEQLENS + b)
    start, end, num_tiles = split_range(seqlen, split, num_splits)

    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, KV_LORA_RANK // 2, 16])
    q_lat_smem, q_rope_smem, k_lat_smem, k_rope_smem, p_smem = _allocate_tiles(Q.dtype.element_ty, KV_LORA_RANK, ROPE_DIM)

    _load_query(q_lat_smem, q_rope_smem, Q, tile, first_token, q_len, Q_STRIDES, HEADS, load_layout)

    bt_row = b * stride_bt_b
    _gather_rows(k_lat_smem.index(0), KV, BLOCK_TABLE, bt_row, start, end, KV_STRIDES,
                 0, KV_LORA_RANK, PAGE_SIZE, load_layout)
    _gather_rows(k_rope_smem.index(0), KV, BLOCK_TABLE, bt_row, start, end, KV_STRIDES,
                 KV_LORA_RANK, ROPE_DIM, PAGE_SIZE, load_layout)
    async_copy.commit_group()

    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    visible = seqlen - q_len + rows // HEADS + 1
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_parts = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK_M, KV_LORA_RANK], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    for t in range(num_tiles):
        tok0 = start + t * BLOCK_N
        stage = t % STAGES
        next_stage = (t + 1) % STAGES
        async_copy.wait_group(0)
        fence_async_shared()
        # One barrier: tile t has landed for every thread, and every warpgroup is past P.V of
        # tile t - 1, so the other stage and P may be overwritten.
        gl.thread_barrier()
        _gather_rows(k_lat_smem.index(next_stage), KV, BLOCK_TABLE, bt_row, tok0 + BLOCK_N, end,
                     KV_STRIDES, 0, KV_LORA_RANK, PAGE_SIZE, load_layout)
        _gather_rows(k_rope_smem.index(next_stage), KV, BLOCK_TABLE, bt_row, tok0 + BLOCK_N, end,
                     KV_STRIDES, KV_LORA_RANK, ROPE_DIM, PAGE_SIZE, load_layout)
        async_copy.commit_group()

        k_lat = k_lat_smem.index(stage)
        s = _masked_scores(q_lat_smem, q_rope_smem, k_lat, k_rope_smem.index(stage), s_zero, tok0, end, visible)
        p, alpha, m_i = online_softmax(s, m_i, 1, scale_log2)
        # Row sums stay per element until the end: no second cross-warpgroup reduction per tile.
        l_parts = l_parts * alpha[:, None] + p
        p_smem.store(p.to(p_smem.dtype))
        fence_async_shared()
        gl.thread_barrier()

        acc = acc * _row_vector(alpha, o_layout)[:, None]
        acc = warpgroup_mma(p_smem, k_lat, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    async_copy.wait_group(0)

    lse, inv_l = finish_rows(m_i, gl.sum(l_parts, 1))
    _store_columns(acc * _row_vector(inv_l, o_layout)[:, None], 0, OUT, PART_OUT,
                   first_token, b, split, num_splits, tile, q_len,
                   OUT_STRIDES, PART_STRIDES, HEADS, o_layout)
    store_lse(lse, rows, LSE, PART_LSE, first_token, b, split, num_splits, q_len,
               LSE_STRIDES, PART_STRIDES, HEADS)


@gluon.jit
def _fp8_softmax_partition(
    q_lat_smem, q_rope_smem, k_lat_smem, k_rope_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
    start, end, num_tiles, seqlen, q_len, tile, first_token, b, split, num_splits, scale_log2, OUT, LSE, PART_OUT,
    PART_LSE, OUT_STRIDES, LSE_STRIDES, PART_STRIDES, kv_scale,
    HEADS: gl.constexpr, KV_LORA_RANK: gl.constexpr,
):
    """First warpgroup: S = Q . K^T over whole tiles, the softmax, P and the row scales for the other
    warpgroup, and P . V for the first half of the latent columns. `kv_scale` multiplies the cache
    (scores and output)."""
    half: gl.constexpr = KV_LORA_RANK // 2
    s_layout: gl.constexpr = _score_layout()
    o_layout: gl.constexpr = _half_output_layout(KV_LORA_RANK)
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    visible = seqlen - q_len + rows // HEADS + 1
    m_i, l_i = no_keys_yet(BLOCK_M, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, half], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    for t in range(num_tiles):
        tok0 = start + t * BLOCK_N
        stage = t % STAGES
        mbarrier.wait(kv_ready.index(stage), (t // STAGES) & 1)
        k_lat = k_lat_smem.index(stage)
        s = _masked_scores(q_lat_smem, q_rope_smem, k_lat, k_rope_smem.index(stage), s_zero, tok0, end, visible)
        p, alpha, m_i = online_softmax(s, m_i, 1, scale_log2 * kv_scale)
        l_i = l_i * alpha + gl.sum(p, 1)
        if t > 0:
            mbarrier.wait(p_free, (t - 1) & 1)
        p_smem.store(p.to(p_smem.dtype))
        alpha = _row_vector(alpha, o_layout)
        row_smem.store(alpha)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p_ready, count=1)

        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_smem, k_lat.slice(0, half, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        mbarrier.arrive(kv_free.index(stage), count=1)

    lse, inv_l = finish_rows(m_i, l_i)
    inv_l = _row_vector(inv_l * kv_scale, o_layout)
    if num_tiles > 0:
        mbarrier.wait(p_free, (num_tiles - 1) & 1)
    row_smem.store(inv_l)
    gl.thread_barrier()
    mbarrier.arrive(p_ready, count=1)
    _store_columns(acc * inv_l[:, None], 0, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                   OUT_STRIDES, PART_STRIDES, HEADS, o_layout)
    store_lse(lse, rows, LSE, PART_LSE, first_token, b, split, num_splits, q_len,
               LSE_STRIDES, PART_STRIDES, HEADS)


@gluon.jit
def _fp8_value_partition(
    k_lat_smem, k_rope_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, num_tiles, first_token, b, split,
    num_splits, tile, q_len, KV, BLOCK_TABLE, bt_row, start, end, KV_STRIDES,
    OUT, PART_OUT, OUT_STRIDES, PART_STRIDES,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr,
):
    """Second warpgroup: P . V for the second half of the latent columns, rescaled by the first
    warpgroup's row factors, and the tile loads: tile t + 2 is converted into the stage tile t frees
    while tile t + 3 is already on its way into registers."""
    half: gl.constexpr = KV_LORA_RANK // 2
    o_layout: gl.constexpr = _half_output_layout(KV_LORA_RANK)
    acc = gl.zeros([BLOCK_M, half], gl.float32, layout=o_layout)
    lat, rope = _load_fp8_tile(KV, BLOCK_TABLE, bt_row, start + STAGES * BLOCK_N, end, KV_STRIDES,
                               PAGE_SIZE, KV_LORA_RANK, ROPE_DIM)
    for t in range(num_tiles):
        stage = t % STAGES
        mbarrier.wait(p_ready, t & 1)
        alpha = row_smem.load(gl.SliceLayout(1, o_layout))
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_smem, k_lat_smem.index(stage).slice(half, half, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        gl.thread_barrier()
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(kv_free.index(stage), count=1)
        if t + STAGES < num_tiles:
            mbarrier.wait(kv_free.index(stage), (t // STAGES) & 1)
            _store_converted(lat, rope, k_lat_smem.index(stage), k_rope_smem.index(stage), kv_ready.index(stage))
            lat, rope = _load_fp8_tile(KV, BLOCK_TABLE, bt_row, start + (t + STAGES + 1) * BLOCK_N, end,
                                       KV_STRIDES, PAGE_SIZE, KV_LORA_RANK, ROPE_DIM)
    mbarrier.wait(p_ready, num_tiles & 1)
    inv_l = row_smem.load(gl.SliceLayout(1, o_layout))
    _store_columns(acc * inv_l[:, None], half, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                   OUT_STRIDES, PART_STRIDES, HEADS, o_layout)


@gluon.jit
def _store_columns(out, col0, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                   OUT_STRIDES, PART_STRIDES,
                   HEADS: gl.constexpr, LAYOUT: gl.constexpr):
    """Output columns col0 .. col0 + width of the tile (`store_output`)."""
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LAYOUT))
    cols = col0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, LAYOUT))
    store_output(out, rows[:, None], cols[None, :], OUT, PART_OUT, first_token, b, split, num_splits, q_len,
                  OUT_STRIDES, PART_STRIDES, HEADS)


@gluon.jit(do_not_specialize=["stride_bt_b"])
def mla_decode_hopper_fp8_kernel(
    Q, KV, KV_SCALE, BLOCK_TABLE, SEQLENS, WORK,
    OUT, LSE, PART_OUT, PART_LSE,
    scale_log2,
    Q_STRIDES, KV_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr,
    KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr,
):
    """Warp-specialized kernel for fp8 (e4m3) pages of any size with one per-tensor scale: launched with
    4 warps (the softmax warpgroup) plus a 4-warp worker (the value warpgroup, which also gathers and
    converts the tiles). Arguments as `mla_decode_hopper_split_kernel`'s, plus the one-element scale KV_SCALE."""
    b, split, num_splits, first_token, q_len = work_item(WORK, gl.program_id(1))
    tile = gl.program_id(0)
    if split >= num_splits or tile * BLOCK_M >= q_len * HEADS:
        return
    seqlen = gl.load(SEQLENS + b)
    start, end, num_tiles = split_range(seqlen, split, num_splits)

    q_lat_smem, q_rope_smem, k_lat_smem, k_rope_smem, p_smem = _allocate_tiles(Q.dtype.element_ty, KV_LORA_RANK, ROPE_DIM)
    row_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(st), count=1)
        mbarrier.init(kv_free.index(st), count=2)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)

    _load_query(q_lat_smem, q_rope_smem, Q, tile, first_token, q_len, Q_STRIDES, HEADS, WARPGROUP_ROWS)
    async_copy.commit_group()
    bt_row = b * stride_bt_b
    kv_scale = gl.load(KV_SCALE)
    for st in gl.static_range(STAGES):
        lat, rope = _load_fp8_tile(KV, BLOCK_TABLE, bt_row, start + st * BLOCK_N, end, KV_STRIDES, PAGE_SIZE,
                                   KV_LORA_RANK, ROPE_DIM)
        _store_converted(lat, rope, k_lat_smem.index(st), k_rope_smem.index(st), kv_ready.index(st))
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()

    gl.warp_specialize([
        (_fp8_softmax_partition, (
            q_lat_smem, q_rope_smem, k_lat_smem, k_rope_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free,
            start, end, num_tiles, seqlen, q_len, tile, first_token, b, split, num_splits, scale_log2, OUT, LSE,
            PART_OUT, PART_LSE, OUT_STRIDES, LSE_STRIDES, PART_STRIDES, kv_scale, HEADS, KV_LORA_RANK)),
        (_fp8_value_partition, (
            k_lat_smem, k_rope_smem, p_smem, row_smem, kv_ready, kv_free, p_ready, p_free, num_tiles, first_token, b,
            split, num_splits, tile, q_len, KV, BLOCK_TABLE, bt_row, start, end, KV_STRIDES,
            OUT, PART_OUT, OUT_STRIDES, PART_STRIDES,
            HEADS, PAGE_SIZE, KV_LORA_RANK, ROPE_DIM)),
    ], [4], [232])


@gluon.jit
def _rope_view(slot, ROPE_DIM: gl.constexpr):
    """A stage's `[BLOCK_N, BLOCK_N]` slot seen as K's rope columns `[BLOCK_N, ROPE_DIM]` (what TMA fills
    and S reads; the slot holds P once S is done with them)."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], slot.dtype)
    return slot._reinterpret(slot.dtype, [BLOCK_N, ROPE_DIM], layout)


@gluon.jit
def _separate_barriers(COUNT: gl.constexpr):
    """COUNT mbarriers, each its own allocation: Triton's barrier analysis does not tell views of one allocation
    apart, and puts a warpgroup barrier between any two operations on them (benchmarks/experiments/membar_probe.py)."""
    barriers = ()
    for _ in gl.static_range(COUNT):
        barriers = barriers + (gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),)
    return barriers


@gluon.jit
def _chunk_barrier(chunk_ready, k_lat, stage: gl.constexpr, c: gl.constexpr):
    """The barrier chunk c of the stage lands on (latent chunks 0 .., then the rope as the last one): its half's,
    or the rope's (three barriers a stage)."""
    return chunk_ready[3 * stage + _barrier_of(k_lat.shape[1] // TMA_CHUNK, c)]


@gluon.constexpr_function
def _barrier_of(lat_chunks, c):
    """Which of a stage's three barriers chunk c (of lat_chunks, the rope as chunk lat_chunks) lands on."""
    return 2 * c // lat_chunks


@gluon.constexpr_function
def _waits_for(lat_chunks, c):
    """Whether chunk c is the first to land on its barrier, so that a reader of the chunks in order waits there
    (waiting twice on one barrier makes the compiler put a warpgroup sync between the waits)."""
    return c == 0 or _barrier_of(lat_chunks, c) != _barrier_of(lat_chunks, c - 1)


@gluon.jit
def _load_chunks(chunk_desc, rope_desc, row, chunk_ready, stage: gl.constexpr, k_lat, slot,
                 FIRST: gl.constexpr, COUNT: gl.constexpr, WITH_ROPE: gl.constexpr, pred):
    """TMA loads of cache rows row .. row + BLOCK_N into the stage: latent chunks FIRST .. FIRST + COUNT (TMA_CHUNK
    columns each, whole halves of the tile: one copy a half, on the half's barrier; fp8: each chunk's box with the
    zeros that fill its 16-bit block's second half) and, WITH_ROPE, the rope columns into the stage's slot on a
    barrier of their own. Nothing is issued where `pred` is false."""
    FP8: gl.constexpr = chunk_desc.block_type.element_ty.is_fp8()
    box: gl.constexpr = chunk_desc.block_type
    per_copy: gl.constexpr = box.shape[0]
    gl.static_assert(FIRST % per_copy == 0 and COUNT % per_copy == 0, "half-tile copies load whole halves")
    blocks = k_lat._reinterpret(box.element_ty, [k_lat.shape[1] // TMA_CHUNK] + box.shape[1:], chunk_desc.layout)
    for h in gl.static_range(FIRST // per_copy, (FIRST + COUNT) // per_copy):
        bar = _chunk_barrier(chunk_ready, k_lat, stage, h * per_copy)
        mbarrier.expect(bar, box.nbytes, pred=pred)
        if FP8:
            coordinates = [h * per_copy, 0, row, 0]
        else:
            coordinates = [h * per_copy, row, 0]
        tma.async_copy_global_to_shared(chunk_desc, coordinates, bar, blocks.slice(h * per_copy, per_copy, dim=0),
                                        pred=pred)
    if WITH_ROPE:
        bar = _chunk_barrier(chunk_ready, k_lat, stage, k_lat.shape[1] // TMA_CHUNK)
        mbarrier.expect(bar, rope_desc.block_type.nbytes, pred=pred)
        if FP8:
            rope_dst = _fp8_block(slot, 0, rope_desc.block_type.element_ty)
        else:
            rope_dst = _rope_view(slot, rope_desc.block_type.shape[1])
        tma.async_copy_global_to_shared(rope_desc, [row, k_lat.shape[1]], bar, rope_dst, pred=pred)


@gluon.jit
def _wait_chunks(chunk_ready, k_lat, stage: gl.constexpr, phase):
    """Waits for every chunk of the stage's tile, the rope included."""
    _wait_chunk_range(chunk_ready, k_lat, stage, phase, 0, k_lat.shape[1] // TMA_CHUNK + 1)


@gluon.jit
def _pair_views(pair, k_lat_smem, q_lat_all):
    """The two K stages and Q, indexed by a 0 the compiler can neither fold nor hoist out of the pair
    loop, so that their per-chunk wgmma descriptors are rebuilt inside it: hoisted, 18 of them stayed
    live across the whole loop and spilled (~40 values per thread; without the spills the 128-head
    cases run 4-9% faster, NOTES.md v29)."""
    zero = gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [pair], dtype=gl.int32, is_pure=False, pack=1)
    return k_lat_smem.index(zero), k_lat_smem.index(zero + 1), q_lat_all.index(zero)


@gluon.jit
def _chunked_scores(q_lat_smem, q_rope_smem, k_lat, slot, chunk_ready, stage: gl.constexpr, phase, s_zero,
                    valid_rows, RIGHT_HALF_FIRST: gl.constexpr, FP8: gl.constexpr, E4M3: gl.constexpr):
    """S = Q . K^T of the stage's tile, each latent chunk's MMA issued as soon as the chunk has landed
    (the right half's chunks first where RIGHT_HALF_FIRST: they are the ones reloaded first). FP8: each
    half's chunks are converted in place together once they have all landed (`_convert_four_blocks_in_place`:
    3% faster than chunk by chunk, NOTES.md v43), rows from valid_rows on zeroed. E4M3 (fp8 pages, Q rounded to
    e4m3 in its blocks' first halves): the MMAs read the e4m3 boxes as they landed, on 8-bit tensor cores, and
    nothing is converted here (rows past the split's end hold anything: the caller masks their scores)."""
    lat_chunks: gl.constexpr = k_lat.shape[1] // TMA_CHUNK
    half: gl.constexpr = lat_chunks // 2
    first: gl.constexpr = half if RIGHT_HALF_FIRST else 0
    convert: gl.constexpr = FP8 and not E4M3
    s = _half_scores(q_lat_smem, k_lat, chunk_ready, stage, phase, s_zero, valid_rows, first, False, convert, E4M3)
    s = _half_scores(q_lat_smem, k_lat, chunk_ready, stage, phase, s, valid_rows, half - first, True, convert, E4M3)
    mbarrier.wait(_chunk_barrier(chunk_ready, k_lat, stage, lat_chunks), phase)
    if convert:
        _convert_block_in_place(slot, 0, valid_rows)
    if E4M3:
        q_rope = _fp8_block(q_rope_smem, 0, gl.float8e4nv)
        k_rope = _fp8_block(slot, 0, gl.float8e4nv)
    else:
        q_rope = q_rope_smem
        k_rope = _rope_view(slot, q_rope_smem.shape[1])
    s = warpgroup_mma(q_rope, k_rope.permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=[s])


@gluon.jit
def _half_scores(q_lat_smem, k_lat, chunk_ready, stage: gl.constexpr, phase, s, valid_rows, FIRST: gl.constexpr,
                 ACCUMULATE: gl.constexpr, CONVERT: gl.constexpr, E4M3: gl.constexpr):
    """S (+)= Q . K^T over the half of the latent chunks from FIRST (fp8 chunks converted first where CONVERT, read
    as e4m3 where E4M3)."""
    count: gl.constexpr = k_lat.shape[1] // TMA_CHUNK // 2
    if CONVERT:
        gl.static_assert(count == 4, "fp8 pages take the seesaw at a latent width of 512 only")
        _wait_chunk_range(chunk_ready, k_lat, stage, phase, FIRST, count)
        _convert_four_blocks_in_place(k_lat, FIRST, valid_rows)
    for c in gl.static_range(FIRST, FIRST + count):
        s = _score_chunk(q_lat_smem, k_lat, chunk_ready, stage, phase, s, c, ACCUMULATE or c > FIRST, E4M3)
    return s


@gluon.jit
def _score_chunk(q_lat_smem, k_lat, chunk_ready, stage: gl.constexpr, phase, s, c: gl.constexpr,
                 use_acc: gl.constexpr, E4M3: gl.constexpr):
    """S += Q . K^T over latent chunk c, issued once the chunk has landed (E4M3: over the chunk's and Q's e4m3 boxes;
    with half-tile copies the wait is at the half's first chunk, which its reader takes first)."""
    if _waits_for(k_lat.shape[1] // TMA_CHUNK, c):
        mbarrier.wait(_chunk_barrier(chunk_ready, k_lat, stage, c), phase)
    if E4M3:
        q_chunk = _fp8_block(q_lat_smem, c, gl.float8e4nv)
        k_chunk = _fp8_block(k_lat, c, gl.float8e4nv)
    else:
        q_chunk = q_lat_smem.slice(c * TMA_CHUNK, TMA_CHUNK, dim=1)
        k_chunk = k_lat.slice(c * TMA_CHUNK, TMA_CHUNK, dim=1)
    return warpgroup_mma(q_chunk, k_chunk.permute((1, 0)), s, use_acc=use_acc, is_async=True)


@gluon.jit
def _fp8_block(buffer, block: gl.constexpr, element_ty: gl.constexpr):
    """Where an fp8 `[BLOCK_N, TMA_CHUNK]` box of 64-column block `block` of a 16-bit `[BLOCK_N, width]`
    buffer lands: the first half of that block's bytes (TMA's 64-byte swizzle), in `element_ty` (fp8 for
    the rope's copy, the 8-bit MMAs and Q's e4m3 stores; int32 words for the conversion). The latent chunks' copies
    land through `half_tile_descriptor`'s `[chunks, 2, BLOCK_N, 64]` view, which addresses the same bytes (both
    are 64-byte rows under one 64-byte swizzle)."""
    blocks: gl.constexpr = buffer.shape[1] // TMA_CHUNK
    per_row: gl.constexpr = TMA_CHUNK * 8 // element_ty.primitive_bitwidth
    layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=element_ty.primitive_bitwidth,
                                                rank=2)
    boxes = buffer._reinterpret(element_ty, [2 * blocks * BLOCK_N, per_row], layout)
    return boxes.slice(2 * block * BLOCK_N, BLOCK_N, dim=0)


@gluon.jit
def _wait_chunk_range(chunk_ready, k_lat, stage: gl.constexpr, phase, FIRST: gl.constexpr, COUNT: gl.constexpr):
    """Waits for chunks FIRST .. FIRST + COUNT of the stage's tile (the rope is the last chunk)."""
    for c in gl.static_range(FIRST, FIRST + COUNT):
        if c == FIRST or _waits_for(k_lat.shape[1] // TMA_CHUNK, c):
            mbarrier.wait(_chunk_barrier(chunk_ready, k_lat, stage, c), phase)


@gluon.jit
def _convert_block_in_place(buffer, block: gl.constexpr, valid_rows):
    """64-column block `block` of a 16-bit `[BLOCK_N, width]` buffer from the fp8 box TMA put into its first
    half (`_fp8_block`), by one warpgroup: every thread reads its words, the warpgroup syncs (the
    block's values overwrite the box), rows from valid_rows on become zeros (past a sequence's end: any
    bytes, NaN included), and the values are fenced for the MMAs that read them next."""
    words = _box_words(buffer, block, valid_rows)
    gl.thread_barrier()
    _store_block_converted(buffer, block, words)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _convert_four_blocks_in_place(buffer, FIRST: gl.constexpr, valid_rows):
    """`_convert_block_in_place` of blocks FIRST .. FIRST + 3: all reads before the sync, one fence. (The
    compiler still puts a sync between the blocks' stores: it cannot tell the block views apart.)"""
    w0 = _box_words(buffer, FIRST, valid_rows)
    w1 = _box_words(buffer, FIRST + 1, valid_rows)
    w2 = _box_words(buffer, FIRST + 2, valid_rows)
    w3 = _box_words(buffer, FIRST + 3, valid_rows)
    gl.thread_barrier()
    _store_block_converted(buffer, FIRST, w0)
    _store_block_converted(buffer, FIRST + 1, w1)
    _store_block_converted(buffer, FIRST + 2, w2)
    _store_block_converted(buffer, FIRST + 3, w3)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _box_words(buffer, block: gl.constexpr, valid_rows):
    """The fp8 box of block `block` as int32 words, rows from valid_rows on zeros."""
    words = _fp8_block(buffer, block, gl.int32).load(FP8_BOX_WORDS)
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, FP8_BOX_WORDS))
    return gl.where((rows < valid_rows)[:, None], words, 0)


@gluon.jit
def _store_block_converted(buffer, block: gl.constexpr, words):
    """fp8 words of block `block` converted into that block's 16-bit values."""
    blocks: gl.constexpr = buffer.shape[1] // TMA_CHUNK
    pairs_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    pairs = buffer._reinterpret(gl.int32, [blocks * BLOCK_N, TMA_CHUNK // 2], pairs_layout)
    _store_words_converted(words, pairs.slice(block * BLOCK_N, BLOCK_N, dim=0), buffer.dtype)


@gluon.jit
def _zero_tail(k_lat, chunk_ready, stage: gl.constexpr, phase, first_bad):
    """Rows first_bad .. of the stage's latent tile zeroed once all its chunks have landed (TMA brings whole
    page rows: rows past a sequence's end may hold anything, NaN included)."""
    _wait_chunks(chunk_ready, k_lat, stage, phase)
    zero_rows_from(k_lat, first_bad, TMA_CHUNK, WARPGROUP_ROWS)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _seesaw_even_partition(
    q_lat_all, q_rope_smem, k_lat_smem, slots, chunk_ready,
    m_even, scale_even, m_odd, scale_odd, sum_odd, final_rows, query_unscale,
    CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, start, end, num_tiles, seqlen, q_len, tile, first_token, b, split,
    num_splits, scale_log2, kv_scale, OUT, LSE, PART_OUT, PART_LSE, OUT_STRIDES, LSE_STRIDES, PART_STRIDES, last,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, E4M3: gl.constexpr,
):
    """Warpgroup 0: S and the softmax of the even tiles (stage 0), output columns of the left half.
    Per pair of tiles: P0 against the running max updated with the even tile; O_L = O_L x scale0 +
    P0 . V0_L (P0 from registers); then, with the odd tile's max from warpgroup 1, P0 rescaled to it for warpgroup 1 and
    O_L = O_L x scale1 + P1 . V1_L. Each stage's chunks are reloaded as soon as their last reader is done.
    For fp8 pages the scores are multiplied by the query rows' unscale factors (`_scale_query`; the
    cache's scale is in scale_log2) and the output by the cache's scale, here. E4M3: S reads the e4m3 boxes, and
    each warpgroup converts the values it multiplies (its half of the columns of both tiles) once their S is done."""
    half: gl.constexpr = KV_LORA_RANK // 2
    lat_chunks: gl.constexpr = KV_LORA_RANK // TMA_CHUNK
    FP8: gl.constexpr = CHUNK_DESC.block_type.element_ty.is_fp8()
    s_layout: gl.constexpr = _score_layout(E4M3)
    o_layout: gl.constexpr = _half_output_layout(KV_LORA_RANK)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    dtype: gl.constexpr = slots.dtype
    rows, visible, unmasked_end = _tile_rows(tile, seqlen, q_len, end, HEADS, gl.SliceLayout(1, s_layout))
    m_i, l_i = no_keys_yet(BLOCK_M, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, half], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if FP8:
        row_unscale = query_unscale.load(gl.SliceLayout(1, s_layout))
    for pair in range(gl.cdiv(num_tiles, 2)):
        k0, k1, q_lat_smem = _pair_views(pair, k_lat_smem, q_lat_all)
        phase = pair & 1
        t0 = 2 * pair
        tok0 = start + t0 * BLOCK_N
        has_odd = t0 + 1 < num_tiles
        next_even = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t0 + 2, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        next_odd = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t0 + 3, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        if not FP8 and tok0 + BLOCK_N > end:
            _zero_tail(k0, chunk_ready, 0, phase, end - tok0)
        s = _chunked_scores(q_lat_smem, q_rope_smem, k0, slots.index(0), chunk_ready, 0, phase, s_zero, end - tok0,
                            False, FP8, E4M3)
        if FP8:
            s = s * row_unscale[:, None]
        p0, scale0, m_i = online_softmax(_masked_near_end(s, tok0, end, visible, unmasked_end), m_i, 1, scale_log2)
        m_even.store(m_i)
        scale_even.store(scale0)
        hand_over(EVEN_MAX_READY)
        if E4M3:
            _convert_four_blocks_in_place(k0, 0, end - tok0)

        acc = acc * _row_vector(scale0, o_layout)[:, None]
        acc = warpgroup_mma(gl.convert_layout(p0.to(dtype), p_layout), k0.slice(0, half, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        gl.thread_barrier()
        _load_chunks(CHUNK_DESC, ROPE_DESC, next_even, chunk_ready, 0, k0, slots.index(0), 0, lat_chunks // 2, False,
                     t0 + 2 < num_tiles)

        if has_odd:
            take_over(ODD_MAX_READY)
            scale1 = scale_odd.load(gl.SliceLayout(1, s_layout))
            odd_sum = sum_odd.load(gl.SliceLayout(1, s_layout))
            m_i = m_odd.load(gl.SliceLayout(1, s_layout))
        else:
            scale1 = gl.full([BLOCK_M], 1.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
            odd_sum = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
        slots.index(0).store((p0 * scale1[:, None]).to(dtype))
        fence_async_shared()
        hand_over(EVEN_P_READY)
        l_i = (l_i * scale0 + gl.sum(p0, 1)) * scale1 + odd_sum

        if not FP8:  # 16-bit pages: warpgroup 1's two P . V go to the tensor cores first (NOTES.md v69)
            take_over(RIGHT_VALUES_ISSUED)
        if has_odd:
            if E4M3:  # warpgroup 1's S of the odd tile is done: it handed over its max
                _convert_four_blocks_in_place(k1, 0, end - tok0 - BLOCK_N)
            acc = acc * _row_vector(scale1, o_layout)[:, None]
            acc = warpgroup_mma(slots.index(1), k1.slice(0, half, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            gl.thread_barrier()
            _load_chunks(CHUNK_DESC, ROPE_DESC, next_odd, chunk_ready, 1, k1, slots.index(1), 0, lat_chunks // 2, True,
                         t0 + 3 < num_tiles)

    if last:
        launch_dependents()
    lse, inv_l = finish_rows(m_i, l_i)
    if FP8:
        inv_l = inv_l * kv_scale
    final_rows.store(inv_l)
    hand_over(ROW_SUMS_READY)
    _store_half(acc * _row_vector(inv_l, o_layout)[:, None], 0, q_lat_all, OUT, PART_OUT, first_token, b, split,
                num_splits, tile, q_len, OUT_STRIDES, PART_STRIDES, HEADS, o_layout)
    store_lse(lse, rows, LSE, PART_LSE, first_token, b, split, num_splits, q_len,
               LSE_STRIDES, PART_STRIDES, HEADS)


@gluon.jit
def _seesaw_odd_partition(
    q_lat_all, q_rope_smem, k_lat_smem, slots, chunk_ready,
    m_even, scale_even, m_odd, scale_odd, sum_odd, final_rows, query_unscale,
    CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, start, end, num_tiles, seqlen, q_len, tile, first_token, b, split,
    num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, E4M3: gl.constexpr,
):
    """Warpgroup 1: S and the softmax of the odd tiles (stage 1, computed while warpgroup 0 does its
    softmax), output columns of the right half: O_R = O_R x scale0 x scale1 + P1 . V1_R (P1 from
    registers), then + P0' . V0_R with warpgroup 0's rescaled P0. On 16-bit pages the second P . V is issued before
    the first is waited for, and warpgroup 0 issues its P1 . V1_L only behind both: the tensor cores take MMAs in
    issue order, and the even stage's right half, which warpgroup 0's next S reads, is reloaded once they are done
    (NOTES.md v69). Scores of fp8 pages, and E4M3's conversions, as in warpgroup 0."""
    half: gl.constexpr = KV_LORA_RANK // 2
    lat_chunks: gl.constexpr = KV_LORA_RANK // TMA_CHUNK
    FP8: gl.constexpr = CHUNK_DESC.block_type.element_ty.is_fp8()
    s_layout: gl.constexpr = _score_layout(E4M3)
    o_layout: gl.constexpr = _half_output_layout(KV_LORA_RANK)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    dtype: gl.constexpr = slots.dtype
    rows, visible, unmasked_end = _tile_rows(tile, seqlen, q_len, end, HEADS, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, half], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if FP8:
        row_unscale = query_unscale.load(gl.SliceLayout(1, s_layout))
    for pair in range(gl.cdiv(num_tiles, 2)):
        k0, k1, q_lat_smem = _pair_views(pair, k_lat_smem, q_lat_all)
        phase = pair & 1
        t1 = 2 * pair + 1
        tok1 = start + t1 * BLOCK_N
        has_odd = t1 < num_tiles
        next_even = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t1 + 1, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        next_odd = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t1 + 2, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        if has_odd:
            if not FP8 and tok1 + BLOCK_N > end:
                _zero_tail(k1, chunk_ready, 1, phase, end - tok1)
            s = _chunked_scores(q_lat_smem, q_rope_smem, k1, slots.index(1), chunk_ready, 1, phase, s_zero,
                                end - tok1, True, FP8, E4M3)
            if FP8:
                s = s * row_unscale[:, None]
            s = _masked_near_end(s, tok1, end, visible, unmasked_end)
        else:
            s = s_zero
        take_over(EVEN_MAX_READY)
        m0 = m_even.load(gl.SliceLayout(1, s_layout))
        scale0 = scale_even.load(gl.SliceLayout(1, s_layout))
        if has_odd:
            p1, scale1, m1 = online_softmax(s, m0, 1, scale_log2)
            slots.index(1).store(p1.to(dtype))
            m_odd.store(m1)
            scale_odd.store(scale1)
            sum_odd.store(gl.sum(p1, 1))
            fence_async_shared()
            hand_over(ODD_MAX_READY)
            if E4M3:
                _convert_four_blocks_in_place(k1, lat_chunks // 2, end - tok1)
            acc = acc * _row_vector(scale0 * scale1, o_layout)[:, None]
            p1_operand = gl.convert_layout(p1.to(dtype), p_layout)
            if FP8:
                acc = warpgroup_mma(p1_operand, k1.slice(half, half, dim=1), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            else:  # the second P . V issued before the first is waited for (NOTES.md v69)
                pending = warpgroup_mma(p1_operand, k1.slice(half, half, dim=1), acc, is_async=True)
                pending = _even_right_values(slots, k0, pending, end - tok1 + BLOCK_N, half, E4M3, True)
                warpgroup_mma_wait(num_outstanding=1, deps=[p1_operand])
            gl.thread_barrier()
            _load_chunks(CHUNK_DESC, ROPE_DESC, next_odd, chunk_ready, 1, k1, slots.index(1), lat_chunks // 2,
                         lat_chunks // 2, False, t1 + 2 < num_tiles)
        else:
            if FP8:
                acc = acc * _row_vector(scale0, o_layout)[:, None]
            else:
                pending = _even_right_values(slots, k0, acc * _row_vector(scale0, o_layout)[:, None],
                                             end - tok1 + BLOCK_N, half, E4M3, True)
        if FP8:  # fp8 pages: the first P . V waited for before the second is issued (5% faster there, NOTES.md v69)
            pending = _even_right_values(slots, k0, acc, end - tok1 + BLOCK_N, half, E4M3, False)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[pending])
        gl.thread_barrier()
        _load_chunks(CHUNK_DESC, ROPE_DESC, next_even, chunk_ready, 0, k0, slots.index(0), lat_chunks // 2,
                     lat_chunks // 2, True, t1 + 1 < num_tiles)
    take_over(ROW_SUMS_READY)
    inv_l = final_rows.load(gl.SliceLayout(1, o_layout))
    _store_half(acc * inv_l[:, None], half, q_lat_all, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                OUT_STRIDES, PART_STRIDES, HEADS, o_layout)


@gluon.jit
def _even_right_values(slots, k0, acc, valid_rows, half: gl.constexpr, E4M3: gl.constexpr, ANNOUNCE: gl.constexpr):
    """Warpgroup 1's O_R += P0' . V0_R, issued once warpgroup 0 has handed P0' over (E4M3: V0_R converted first;
    warpgroup 0's S of the even tile is done by then), and with ANNOUNCE the hand-over that lets warpgroup 0 issue its
    P1 . V1_L behind it. Returns the MMA in flight: the caller waits."""
    take_over(EVEN_P_READY)
    if E4M3:
        _convert_four_blocks_in_place(k0, k0.shape[1] // TMA_CHUNK // 2, valid_rows)
    pending = warpgroup_mma(slots.index(0), k0.slice(half, half, dim=1), acc, is_async=True)
    if ANNOUNCE:
        hand_over(RIGHT_VALUES_ISSUED)
    return pending


@gluon.jit
def _store_half(out, col0, q_lat_all, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                OUT_STRIDES, PART_STRIDES, HEADS: gl.constexpr, LAYOUT: gl.constexpr):
    """A seesaw warpgroup's normalized half of the output, columns col0 .. . A single-split sequence's goes to
    OUT through the same columns of the query buffer, which neither warpgroup reads once both have passed
    their last S: the accumulator's layout would write each row in 4-byte pieces, half a sector at a time,
    and the programs of a batch that fills the GPU all store at once (NOTES.md v49). A split's float32
    partial, twice as wide, goes straight from the accumulator. (The next unit's Q arrives by cp.async, in the
    generic proxy like these stores; a TMA load of Q would need a proxy fence after the read-back.)"""
    if num_splits == 1:
        staging = _as_dtype(q_lat_all.index(0), OUT.dtype.element_ty).slice(col0, out.shape[1], dim=1)
        pieces: gl.constexpr = row_piece_layout(out.shape[1])
        values = staged_in_row_pieces(staging, out.to(OUT.dtype.element_ty))
        rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, pieces))
        cols = col0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, pieces))
        store_output(values, rows[:, None], cols[None, :], OUT, PART_OUT, first_token, b, 0, 1, q_len,
                     OUT_STRIDES, PART_STRIDES, HEADS)
    else:
        _store_columns(out, col0, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                       OUT_STRIDES, PART_STRIDES, HEADS, LAYOUT)


@gluon.jit(do_not_specialize=["stride_bt_b", "work_rows"])
def mla_decode_hopper_seesaw_kernel(
    Q, CHUNK_DESC, ROPE_DESC, KV_SCALE, BLOCK_TABLE, SEQLENS, WORK,
    OUT, LSE, PART_OUT, PART_LSE,
    scale_log2,
    Q_STRIDES, KV_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES,
    WORK_STATE, work_rows, row_tiles, MERGE_STATE,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr,
    KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr, MERGE: gl.constexpr, EVICT_FIRST: gl.constexpr,
    E4M3_SCORES: gl.constexpr,
):
    """Two warpgroups taking turns over tile pairs ("seesaw"), for 16-bit pages that hold whole tiles:
    even tiles in stage 0 (warpgroup 0's S and softmax), odd tiles in stage 1 (warpgroup 1's), each
    warpgroup owning half of the output columns and using the other's P through shared memory, so one
    warpgroup's softmax runs while the other's MMAs do. Tiles arrive as two latent halves and the rope,
    each on its own barrier. Persistent: a launch of at most one program per SM takes the plan's units (a work item's
    row tile; WORK_STATE[0] items of row_tiles units each, in a plan of work_rows rows), unit p first for
    program p, so that no program waits behind programs that find no work; then, for a ragged batch
    (WORK_STATE[2]), the next untaken one as each program finishes one (`take_unit`: the shorter splits
    fill in where programs finish first), otherwise in snake order (program p's second unit is the p-th
    from the end of the second round, ...), each unit's plan entry loaded while the one before runs
    (NOTES.md v30). With MERGE, a split's partial is counted in MERGE_STATE once written, and the program
    that writes a sequence's last split merges the partials (`_merge_if_last`) instead of a combine kernel. In a
    non-ragged plan a program past its last unit's tile loop executes `launch_dependents` where that unit's sequence
    has at most EARLY_TRIGGER_MAX_SPLITS splits (only a combine launched behind this kernel reacts to it); otherwise
    the programs let it launch as they exit. With EVICT_FIRST
    the cache's TMA loads carry an L2 evict-first policy (`l2_evict_first`; the launch rewrites the PTX). With
    E4M3_SCORES (fp8 pages) the query rows are rounded to e4m3 and S runs on 8-bit tensor cores over the boxes as
    TMA put them; only the values P multiplies are converted, after their S.
    Arguments as `mla_decode_hopper_split_kernel`'s, with the cache's chunk TMA descriptors and, for fp8 pages
    (each chunk loaded into the first half of its 16-bit place and converted there by the warpgroup whose
    S reads it first, NOTES.md v43; with E4M3_SCORES by the warpgroup whose P . V reads it, after S), the one-element
    scale KV_SCALE.
    """
    FP8: gl.constexpr = CHUNK_DESC.block_type.element_ty.is_fp8()
    if EVICT_FIRST:
        mark_evict_first()
    # fp8 pages: the 16-bit MMAs (P V, and S without E4M3_SCORES) run in fp16 (e4m3 -> fp16 is one instruction per
    # pair, to bf16 five).
    dtype: gl.constexpr = gl.float16 if FP8 else Q.dtype.element_ty
    lat_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, KV_LORA_RANK], dtype)
    # Q with a leading dimension of one, for `_pair_views` to index.
    q_lat_all = gl.allocate_shared_memory(dtype, [1, BLOCK_M, KV_LORA_RANK], lat_layout)
    q_rope_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, ROPE_DIM],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_M, ROPE_DIM], dtype))
    k_lat_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, KV_LORA_RANK], lat_layout)
    slots = gl.allocate_shared_memory(dtype, [2, BLOCK_M, BLOCK_N],
                                      gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype))
    row_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    rows_smem = gl.allocate_shared_memory(gl.float32, [7, BLOCK_M], row_layout)
    chunk_ready = _separate_barriers(2 * 3)  # a stage's two halves and its rope

    if FP8:
        kv_scale = gl.load(KV_SCALE)
    else:
        kv_scale = 1.0
    scale_log2 = scale_log2 * kv_scale
    programs = gl.num_programs(0)
    units = gl.load(WORK_STATE) * row_tiles
    ragged = gl.load(WORK_STATE + 2) != 0
    unit = gl.program_id(0)
    b, split, num_splits, first_token, q_len, seqlen = _unit_work(WORK, SEQLENS, unit, row_tiles, work_rows)
    units_done = 0
    while unit < units:
        units_done += 1
        if ragged:
            next_unit = units
        else:  # the next unit known now: its plan entry and length load while this one runs
            next_unit = (units_done * programs
                         + gl.where(units_done % 2 == 0, gl.program_id(0), programs - 1 - gl.program_id(0)))
        next_work = _unit_work(WORK, SEQLENS, next_unit, row_tiles, work_rows)
        tile = unit % row_tiles
        # A ragged plan's next unit is taken only after this one.
        last = (next_unit >= units) & (not ragged) & (num_splits <= EARLY_TRIGGER_MAX_SPLITS)
        if split < num_splits and tile * BLOCK_M < q_len * HEADS:
            _seesaw_unit(
                q_lat_all, q_rope_smem, k_lat_smem, slots, rows_smem, chunk_ready,
                Q, CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, seqlen, b, split, num_splits, first_token,
                q_len, tile, OUT, LSE, PART_OUT, PART_LSE, scale_log2, kv_scale, Q_STRIDES, stride_bt_b, OUT_STRIDES,
                LSE_STRIDES, PART_STRIDES, last, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3_SCORES)
            if MERGE and num_splits > 1:
                _merge_if_last(WORK, unit, row_tiles, MERGE_STATE, OUT, LSE, PART_OUT, PART_LSE,
                               OUT_STRIDES, LSE_STRIDES, PART_STRIDES, HEADS, KV_LORA_RANK)
        if ragged:
            unit = take_unit(WORK_STATE + 1, units, programs)
            b, split, num_splits, first_token, q_len, seqlen = _unit_work(WORK, SEQLENS, unit, row_tiles, work_rows)
        else:
            unit = next_unit
            b, split, num_splits, first_token, q_len, seqlen = next_work


@gluon.jit
def _merge_if_last(WORK, unit, row_tiles, MERGE_STATE, OUT, LSE, PART_OUT, PART_LSE,
                   OUT_STRIDES, LSE_STRIDES, PART_STRIDES, HEADS: gl.constexpr, KV_LORA_RANK: gl.constexpr):
    """Counts a unit's split as written (its partial stored by both warpgroups); the program that writes
    the last of a sequence's splits merges them all into the output and sets the count back to zero
    for the next launch. Nobody waits: the other splits' programs have gone on. (The unit's plan entry
    is loaded again: kept from before the unit, it would take registers from the warpgroups.)"""
    b, _, num_splits, first_token, q_len = work_item(WORK, unit // row_tiles)
    tile = unit % row_tiles
    arrivals = MERGE_STATE + b * row_tiles + tile
    # The other warpgroup's partial stores are ordered by the CTA-wide barrier that ends warp_specialize;
    # this one orders this warpgroup's before the one-thread acq_rel atomic.
    gl.thread_barrier()
    if gl.atomic_add(arrivals, 1) == num_splits - 1:
        gl.store(arrivals, 0)
        for block in range(KV_LORA_RANK // MERGE_COLUMNS):
            _merge_block(b, tile, block, num_splits, first_token, q_len, OUT, LSE, PART_OUT, PART_LSE,
                         OUT_STRIDES, LSE_STRIDES, PART_STRIDES, HEADS)


@gluon.jit
def _merge_block(b, tile, block, num_splits, first_token, q_len, OUT, LSE, PART_OUT, PART_LSE,
                 OUT_STRIDES, LSE_STRIDES, PART_STRIDES, HEADS: gl.constexpr):
    """Latent columns block x MERGE_COLUMNS .. of a row tile's output: its splits' partials weighted by
    their lse, MERGE_SPLITS_PER_STEP loaded at a time (from L2: other programs wrote them), against a
    running max; block 0 also writes the lse."""
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MERGE_LAYOUT))
    cols = block * MERGE_COLUMNS + gl.arange(0, MERGE_COLUMNS, layout=gl.SliceLayout(0, MERGE_LAYOUT))
    row_ok = rows < q_len * HEADS
    lse_rows = PART_LSE + b * PART_STRIDES[3] + rows
    part_rows = PART_OUT + b * PART_STRIDES[0] + rows[:, None] * PART_STRIDES[2] + cols[None, :]
    m, total = no_keys_yet(BLOCK_M, gl.SliceLayout(1, MERGE_LAYOUT))
    acc = gl.zeros([BLOCK_M, MERGE_COLUMNS], gl.float32, layout=MERGE_LAYOUT)
    for first in range(0, num_splits, MERGE_SPLITS_PER_STEP):
        for step in gl.static_range(MERGE_SPLITS_PER_STEP):
            present = row_ok & (first + step < num_splits)
            lse = gl.load(lse_rows + (first + step) * PART_STRIDES[4], mask=present, other=float("-inf"),
                          cache_modifier=".cg")
            part = gl.load(part_rows + (first + step) * PART_STRIDES[1], mask=present[:, None], other=0.0,
                           cache_modifier=".cg")
            m_new = gl.maximum(m, lse)
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            rescale = gl.exp(m - m_safe)
            weight = gl.exp(lse - m_safe)
            total = total * rescale + weight
            acc = acc * rescale[:, None] + part * weight[:, None]
            m = m_new
    has_keys = total > 0
    safe_total = gl.where(has_keys, total, 1.0)
    store_output(acc / safe_total[:, None], rows[:, None], cols[None, :], OUT, PART_OUT, first_token, b, 0, 1, q_len,
                 OUT_STRIDES, PART_STRIDES, HEADS)
    if block == 0:
        lse = gl.where(has_keys, gl.where(m == float("-inf"), 0.0, m) + gl.log(safe_total), float("-inf"))
        store_lse(lse, rows, LSE, PART_LSE, first_token, b, 0, 1, q_len, LSE_STRIDES, PART_STRIDES, HEADS)


@gluon.jit
def _as_dtype(buffer, dtype: gl.constexpr):
    """A 16-bit swizzled buffer seen as `dtype` (16-bit too)."""
    return buffer._reinterpret(dtype, buffer.shape, gl.NVMMASharedLayout.get_default_for(buffer.shape, dtype))


@gluon.jit
def _scale_query(q_lat, q_rope, q_dtype: gl.constexpr, unscale_smem, E4M3: gl.constexpr):
    """For fp8 pages, whose S runs in fp16 (E4M3: in e4m3): the tile's query rows, loaded as `q_dtype` into the fp16
    buffers, scaled in place per row by a power of two (`query_row_factor`) and stored as fp16; the factor undoing
    it goes to `unscale_smem` for the scores. Two passes over 64-column blocks: the rows' maxima, then the
    scaling (each thread rewrites the values it read). E4M3: scaled into e4m3's range and rounded to e4m3 into each
    block's first half instead (`_fp8_block`, where S reads them), each block read whole before it is written."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, QUERY_BLOCK)
    amax = gl.zeros([BLOCK_M], gl.float32, layout=rows_layout)
    for c in gl.static_range(q_lat.shape[1] // TMA_CHUNK):
        amax = gl.maximum(amax, gl.max(gl.abs(_query_block(q_lat, q_dtype, c)), 1))
    amax = gl.maximum(amax, gl.max(gl.abs(_query_block(q_rope, q_dtype, 0)), 1))
    if E4M3:
        factor = query_row_factor(amax, E4M3_QUERY_EXPONENT)
        for c in gl.static_range(q_lat.shape[1] // TMA_CHUNK):
            _store_e4m3_block(q_lat, c, _query_block(q_lat, q_dtype, c) * factor[:, None])
        _store_e4m3_block(q_rope, 0, _query_block(q_rope, q_dtype, 0) * factor[:, None])
    else:
        factor = query_row_factor(amax, FP16_QUERY_EXPONENT)
        for c in gl.static_range(q_lat.shape[1] // TMA_CHUNK):
            scaled = (_query_block(q_lat, q_dtype, c) * factor[:, None]).to(gl.float16)
            q_lat.slice(c * TMA_CHUNK, TMA_CHUNK, dim=1).store(scaled)
        q_rope.store((_query_block(q_rope, q_dtype, 0) * factor[:, None]).to(gl.float16))
    unscale_smem.store(1.0 / factor)


@gluon.jit
def _store_e4m3_block(buffer, block: gl.constexpr, values):
    """Block `block`'s values (read from it) rounded to e4m3 into its first half, once every thread has read it."""
    rounded = values.to(gl.float8e4nv)
    gl.thread_barrier()
    _fp8_block(buffer, block, gl.float8e4nv).store(rounded)


@gluon.jit
def _query_block(buffer, q_dtype: gl.constexpr, c: gl.constexpr):
    """Columns c x 64 .. of a query buffer holding `q_dtype` values, in fp32."""
    return _as_dtype(buffer, q_dtype).slice(c * TMA_CHUNK, TMA_CHUNK, dim=1).load(QUERY_BLOCK).to(gl.float32)


@gluon.jit
def _unit_work(WORK, SEQLENS, unit, row_tiles, work_rows):
    """`work_item` of the unit's item and the sequence's length (a unit past the plan's rows reads the
    last row instead; the caller never runs units past the plan's items)."""
    b, split, num_splits, first_token, q_len = work_item(WORK, gl.minimum(unit // row_tiles, work_rows - 1))
    return b, split, num_splits, first_token, q_len, gl.load(SEQLENS + b)


@gluon.jit
def _seesaw_unit(
    q_lat_all, q_rope_smem, k_lat_smem, slots, rows_smem, chunk_ready,
    Q, CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, seqlen, b, split, num_splits, first_token, q_len, tile,
    OUT, LSE, PART_OUT, PART_LSE, scale_log2, kv_scale, Q_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES,
    last, HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, E4M3: gl.constexpr,
):
    """One unit of the seesaw kernel (a split's row tile), on chunk barriers initialized for it and
    invalidated after it: Q and the first two tiles loaded, then the two warpgroups' partitions."""
    start, end, num_tiles = split_range(seqlen, split, num_splits)
    chunks: gl.constexpr = KV_LORA_RANK // TMA_CHUNK + 1
    for c in gl.static_range(len(chunk_ready)):
        mbarrier.init(chunk_ready[c], count=1)
    FP8: gl.constexpr = CHUNK_DESC.block_type.element_ty.is_fp8()
    q_dtype: gl.constexpr = Q.dtype.element_ty
    _load_query(_as_dtype(q_lat_all.index(0), q_dtype), _as_dtype(q_rope_smem, q_dtype), Q, tile, first_token, q_len,
                Q_STRIDES, HEADS, WARPGROUP_ROWS)
    async_copy.commit_group()
    bt_row = b * stride_bt_b
    for st in gl.static_range(2):
        if st < num_tiles:
            _load_chunks(CHUNK_DESC, ROPE_DESC, _cache_row(BLOCK_TABLE, bt_row, start + st * BLOCK_N, PAGE_SIZE), chunk_ready,
                         st, k_lat_smem.index(st), slots.index(st), 0, chunks - 1, True, True)
    async_copy.wait_group(0)
    query_unscale = rows_smem.index(6)
    if FP8:
        gl.thread_barrier()
        _scale_query(q_lat_all.index(0), q_rope_smem, q_dtype, query_unscale, E4M3)
    fence_async_shared()
    gl.thread_barrier()

    m_even, scale_even, m_odd, scale_odd, sum_odd, final_rows = (rows_smem.index(0), rows_smem.index(1),
                                                                 rows_smem.index(2), rows_smem.index(3),
                                                                 rows_smem.index(4), rows_smem.index(5))
    gl.warp_specialize([
        (_seesaw_even_partition, (
            q_lat_all, q_rope_smem, k_lat_smem, slots, chunk_ready,
            m_even, scale_even, m_odd, scale_odd, sum_odd, final_rows, query_unscale,
            CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, start, end, num_tiles, seqlen, q_len, tile, first_token, b, split,
            num_splits, scale_log2, kv_scale, OUT, LSE, PART_OUT, PART_LSE,
            OUT_STRIDES, LSE_STRIDES,
            PART_STRIDES, last, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3)),
        (_seesaw_odd_partition, (
            q_lat_all, q_rope_smem, k_lat_smem, slots, chunk_ready,
            m_even, scale_even, m_odd, scale_odd, sum_odd, final_rows, query_unscale,
            CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, start, end, num_tiles, seqlen, q_len, tile, first_token, b, split,
            num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES,
            HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3)),
    ], [4], [248])
    for c in gl.static_range(len(chunk_ready)):
        mbarrier.invalidate(chunk_ready[c])


SEESAW = CachedLaunch(mla_decode_hopper_seesaw_kernel, ptx_rewrite=evict_first_tma_loads)
FP8_SPLIT = CachedLaunch(mla_decode_hopper_fp8_kernel)
SPLIT = CachedLaunch(mla_decode_hopper_split_kernel)
