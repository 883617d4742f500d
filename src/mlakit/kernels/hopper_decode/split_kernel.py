"""The cp.async split kernel, for 16-bit pages the seesaw does not take: rows gathered one tile ahead, S split
between the warpgroups over the tile's tokens, P . V over half of the latent columns each."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from mlakit.kernels.gluon_compat import cp_async_load, thread_barrier
from mlakit.kernels.hopper_common import BLOCK_N, finish_rows, grid_work, online_softmax, split_range, store_lse
from mlakit.kernels.hopper_decode.constants import BLOCK_M, NUM_WARPS, STAGES
from mlakit.kernels.hopper_decode.tile_helpers import (_allocate_tiles, _load_query, _masked_scores, _row_vector,
                                                       _store_columns)


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
    cp_async_load(smem, KV + row_base[:, None] + cols[None, :], mask=tok_ok[:, None])


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
    b, split, num_splits, first_token, q_len, tile, idle = grid_work(WORK, BLOCK_M, HEADS)
    if idle:
        return
    seqlen = gl.load(SEQLENS + b)
    start, end, num_tiles = split_range(WORK, gl.program_id(1), seqlen)

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
        thread_barrier()
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
        thread_barrier()

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
