"""fp8 pages on the seesaw: each chunk's e4m3 box converted in place into its 16-bit block (rows past the split's end
zeroed), and the query rows scaled per row into fp16's range, or rounded to e4m3 for S on 8-bit tensor cores."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from mlakit.kernels.gluon_compat import reinterpret, thread_barrier
from mlakit.kernels.hopper_common import BLOCK_N, E4M3_QUERY_EXPONENT, FP16_QUERY_EXPONENT, query_row_factor
from mlakit.kernels.hopper_decode.constants import BLOCK_M, FP8_BOX_WORDS, QUERY_BLOCK, TMA_CHUNK
from mlakit.kernels.hopper_decode.e4m3_words import _store_words_converted
from mlakit.kernels.hopper_decode.seesaw_loads import _as_dtype, _fp8_block


@gluon.jit
def _convert_block_in_place(buffer, block: gl.constexpr, valid_rows):
    """64-column block `block` of a 16-bit `[BLOCK_N, width]` buffer from the fp8 box TMA put into its first
    half (`_fp8_block`), by one warpgroup: every thread reads its words, the warpgroup syncs (the
    block's values overwrite the box), rows from valid_rows on become zeros (past a sequence's end: any
    bytes, NaN included), and the values are fenced for the MMAs that read them next."""
    words = _box_words(buffer, block, valid_rows)
    thread_barrier()
    _store_block_converted(buffer, block, words)
    fence_async_shared()
    thread_barrier()


@gluon.jit
def _convert_four_blocks_in_place(buffer, FIRST: gl.constexpr, valid_rows):
    """`_convert_block_in_place` of blocks FIRST .. FIRST + 3: all reads before the sync, one fence. (The
    compiler still puts a sync between the blocks' stores: it cannot tell the block views apart.)"""
    w0 = _box_words(buffer, FIRST, valid_rows)
    w1 = _box_words(buffer, FIRST + 1, valid_rows)
    w2 = _box_words(buffer, FIRST + 2, valid_rows)
    w3 = _box_words(buffer, FIRST + 3, valid_rows)
    thread_barrier()
    _store_block_converted(buffer, FIRST, w0)
    _store_block_converted(buffer, FIRST + 1, w1)
    _store_block_converted(buffer, FIRST + 2, w2)
    _store_block_converted(buffer, FIRST + 3, w3)
    fence_async_shared()
    thread_barrier()


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
    pairs = reinterpret(buffer, gl.int32, [blocks * BLOCK_N, TMA_CHUNK // 2], pairs_layout)
    _store_words_converted(words, pairs.slice(block * BLOCK_N, BLOCK_N, dim=0), buffer.dtype)


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
    thread_barrier()
    _fp8_block(buffer, block, gl.float8e4nv).store(rounded)


@gluon.jit
def _query_block(buffer, q_dtype: gl.constexpr, c: gl.constexpr):
    """Columns c x 64 .. of a query buffer holding `q_dtype` values, in fp32."""
    return _as_dtype(buffer, q_dtype).slice(c * TMA_CHUNK, TMA_CHUNK, dim=1).load(QUERY_BLOCK).to(gl.float32)
