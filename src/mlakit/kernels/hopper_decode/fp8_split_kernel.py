"""The warp-specialized split kernel for fp8 (e4m3) pages the seesaw does not take: the softmax warpgroup computes S
over whole tiles, the value warpgroup gathers the tiles into registers and converts them into the 16-bit stages,
and each does P . V over half of the latent columns."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from mlakit.kernels.gluon_compat import reinterpret, thread_barrier
from mlakit.kernels.hopper_common import (BLOCK_N, finish_rows, grid_work, no_keys_yet, online_softmax, split_range,
                                          store_lse)
from mlakit.kernels.hopper_decode.constants import BLOCK_M, STAGES, WARPGROUP_ROWS, _half_output_layout, _score_layout
from mlakit.kernels.hopper_decode.e4m3_words import _store_words_converted
from mlakit.kernels.hopper_decode.tile_helpers import (_allocate_tiles, _load_query, _masked_scores, _row_vector,
                                                       _store_columns)


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


@gluon.jit
def _store_converted(lat, rope, lat_dst, rope_dst, ready):
    """A loaded fp8 tile (int32 words) converted to the stage's dtype and stored into it; `ready` signalled."""
    _store_words_converted(lat, _as_pairs(lat_dst), lat_dst.dtype)
    _store_words_converted(rope, _as_pairs(rope_dst), rope_dst.dtype)
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(ready, count=1)


@gluon.jit
def _as_pairs(dst):
    """A swizzled 16-bit `[rows, n]` buffer as int32 `[rows, n / 2]`: one word per pair of values."""
    pair_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=dst.layout.swizzle_byte_width,
                                                     element_bitwidth=32, rank=2)
    return reinterpret(dst, gl.int32, [dst.shape[0], dst.shape[1] // 2], pair_layout)


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
        thread_barrier()
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
    thread_barrier()
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
        thread_barrier()
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
    b, split, num_splits, first_token, q_len, tile, idle = grid_work(WORK, BLOCK_M, HEADS)
    if idle:
        return
    seqlen = gl.load(SEQLENS + b)
    start, end, num_tiles = split_range(WORK, gl.program_id(1), seqlen)

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
    thread_barrier()

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
