"""The seesaw's loads: TMA copies of a tile's latent halves and rope into a stage, each on its own mbarrier, the waits
for them, a tile's rows past a sequence's end zeroed once landed, and the views of the shared buffers the copies
land in and the MMAs read."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from mlakit.kernels.gluon_compat import reinterpret, thread_barrier, tma_load
from mlakit.kernels.hopper_common import BLOCK_N, zero_rows_from
from mlakit.kernels.hopper_decode.constants import TMA_CHUNK, WARPGROUP_ROWS


@gluon.jit
def _cache_row(BLOCK_TABLE, bt_row, tok0, PAGE_SIZE: gl.constexpr):
    """Row of the `[pages x page_size, dim]` cache matrix holding token tok0 of the sequence."""
    return gl.load(BLOCK_TABLE + bt_row + tok0 // PAGE_SIZE) * PAGE_SIZE + tok0 % PAGE_SIZE


@gluon.jit
def _rope_view(slot, ROPE_DIM: gl.constexpr):
    """A stage's `[BLOCK_N, BLOCK_N]` slot seen as K's rope columns `[BLOCK_N, ROPE_DIM]` (what TMA fills
    and S reads; the slot holds P once S is done with them)."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], slot.dtype)
    return reinterpret(slot, slot.dtype, [BLOCK_N, ROPE_DIM], layout)


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
    blocks = reinterpret(k_lat, box.element_ty, [k_lat.shape[1] // TMA_CHUNK] + box.shape[1:], chunk_desc.layout)
    for h in gl.static_range(FIRST // per_copy, (FIRST + COUNT) // per_copy):
        bar = _chunk_barrier(chunk_ready, k_lat, stage, h * per_copy)
        mbarrier.expect(bar, box.nbytes, pred=pred)
        if FP8:
            coordinates = [h * per_copy, 0, row, 0]
        else:
            coordinates = [h * per_copy, row, 0]
        tma_load(chunk_desc, coordinates, bar, blocks.slice(h * per_copy, per_copy, dim=0),
                 pred=pred)
    if WITH_ROPE:
        bar = _chunk_barrier(chunk_ready, k_lat, stage, k_lat.shape[1] // TMA_CHUNK)
        mbarrier.expect(bar, rope_desc.block_type.nbytes, pred=pred)
        if FP8:
            rope_dst = _fp8_block(slot, 0, rope_desc.block_type.element_ty)
        else:
            rope_dst = _rope_view(slot, rope_desc.block_type.shape[1])
        tma_load(rope_desc, [row, k_lat.shape[1]], bar, rope_dst, pred=pred)


@gluon.jit
def _wait_chunks(chunk_ready, k_lat, stage: gl.constexpr, phase):
    """Waits for every chunk of the stage's tile, the rope included."""
    _wait_chunk_range(chunk_ready, k_lat, stage, phase, 0, k_lat.shape[1] // TMA_CHUNK + 1)


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
    boxes = reinterpret(buffer, element_ty, [2 * blocks * BLOCK_N, per_row], layout)
    return boxes.slice(2 * block * BLOCK_N, BLOCK_N, dim=0)


@gluon.jit
def _wait_chunk_range(chunk_ready, k_lat, stage: gl.constexpr, phase, FIRST: gl.constexpr, COUNT: gl.constexpr):
    """Waits for chunks FIRST .. FIRST + COUNT of the stage's tile (the rope is the last chunk)."""
    for c in gl.static_range(FIRST, FIRST + COUNT):
        if c == FIRST or _waits_for(k_lat.shape[1] // TMA_CHUNK, c):
            mbarrier.wait(_chunk_barrier(chunk_ready, k_lat, stage, c), phase)


@gluon.jit
def _zero_tail(k_lat, chunk_ready, stage: gl.constexpr, phase, first_bad):
    """Rows first_bad .. of the stage's latent tile zeroed once all its chunks have landed (TMA brings whole
    page rows: rows past a sequence's end may hold anything, NaN included)."""
    _wait_chunks(chunk_ready, k_lat, stage, phase)
    zero_rows_from(k_lat, first_bad, TMA_CHUNK, WARPGROUP_ROWS)
    fence_async_shared()
    thread_barrier()


@gluon.jit
def _as_dtype(buffer, dtype: gl.constexpr):
    """A 16-bit swizzled buffer seen as `dtype` (16-bit too)."""
    return reinterpret(buffer, dtype, buffer.shape, gl.NVMMASharedLayout.get_default_for(buffer.shape, dtype))
