"""The seesaw's two warpgroups (its `gl.warp_specialize` partitions): S and the softmax of the even and of the odd
tiles, each latent chunk's MMA issued as the chunk lands, the running max and P handed over on named barriers, P . V
over each warpgroup's half of the latent columns, and its half of the output stored."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from mlakit.kernels.gluon_compat import thread_barrier
from mlakit.kernels.hopper_common import (BLOCK_N, finish_rows, hand_over, launch_dependents, no_keys_yet,
                                          online_softmax, row_piece_layout, staged_in_row_pieces, store_lse,
                                          store_output, take_over)
from mlakit.kernels.hopper_decode.constants import (BLOCK_M, EVEN_MAX_READY, EVEN_P_READY, ODD_MAX_READY,
                                                    RIGHT_VALUES_ISSUED, ROW_SUMS_READY, TMA_CHUNK, _half_output_layout,
                                                    _score_layout)
from mlakit.kernels.hopper_decode.next_unit_prefetch import prefetch_to_l2
from mlakit.kernels.hopper_decode.seesaw_fp8 import _convert_block_in_place, _convert_four_blocks_in_place
from mlakit.kernels.hopper_decode.seesaw_loads import (_as_dtype, _cache_row, _chunk_barrier, _fp8_block, _load_chunks,
                                                       _rope_view, _wait_chunk_range, _waits_for, _zero_tail)
from mlakit.kernels.hopper_decode.tile_helpers import _masked, _row_vector, _store_columns


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
def _pair_views(pair, k_lat_smem, q_lat_all):
    """The two K stages and Q, indexed by a 0 the compiler can neither fold nor hoist out of the pair
    loop, so that their per-chunk wgmma descriptors are rebuilt inside it: hoisted, 18 of them stayed
    live across the whole loop and spilled (~40 values per thread; without the spills the 128-head
    cases run 4-9% faster, NOTES.md v29)."""
    zero = gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [pair], dtype=gl.int32, is_pure=False, pack=1)
    return k_lat_smem.index(zero), k_lat_smem.index(zero + 1), q_lat_all.index(zero)


@gluon.jit
def _chunked_scores(q_lat_smem, q_rope_smem, k_lat, slot, chunk_ready, stage: gl.constexpr, phase, s_zero,
                    valid_rows, FP8: gl.constexpr, E4M3: gl.constexpr):
    """S = Q . K^T of the stage's tile, each latent chunk's MMA issued as soon as the chunk has landed, the right
    half's chunks first (the odd stage's: they are the ones reloaded first). FP8: each
    half's chunks are converted in place together once they have all landed (`_convert_four_blocks_in_place`:
    3% faster than chunk by chunk, NOTES.md v43), rows from valid_rows on zeroed. E4M3 (fp8 pages, Q rounded to
    e4m3 in its blocks' first halves): the MMAs read the e4m3 boxes as they landed, on 8-bit tensor cores, and
    nothing is converted here (rows past the split's end hold anything: the caller masks their scores)."""
    s = _half_scores(q_lat_smem, k_lat, chunk_ready, stage, phase, s_zero, valid_rows, k_lat.shape[1] // TMA_CHUNK // 2,
                     False, FP8 and not E4M3, E4M3)
    return _scores_after_first_half(q_lat_smem, q_rope_smem, k_lat, slot, chunk_ready, stage, phase, s, valid_rows,
                                    True, FP8, E4M3)


@gluon.jit
def _scores_after_first_half(q_lat_smem, q_rope_smem, k_lat, slot, chunk_ready, stage: gl.constexpr, phase, s,
                             valid_rows, RIGHT_HALF_FIRST: gl.constexpr, FP8: gl.constexpr, E4M3: gl.constexpr):
    """`_chunked_scores` from the first half's scores `s` on (issued, or done): the other half's and the rope's MMAs,
    then the wait for all of them."""
    lat_chunks: gl.constexpr = k_lat.shape[1] // TMA_CHUNK
    half: gl.constexpr = lat_chunks // 2
    first: gl.constexpr = half if RIGHT_HALF_FIRST else 0
    convert: gl.constexpr = FP8 and not E4M3
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
def _even_left_scores(q_lat_smem, k0, chunk_ready, phase, s_zero, valid_rows, CONVERT: gl.constexpr,
                      E4M3: gl.constexpr):
    """S = Q . K^T of the even stage's tile over the left half of the latent chunks, issued (`_half_scores`)."""
    return _half_scores(q_lat_smem, k0, chunk_ready, 0, phase, s_zero, valid_rows, 0, False, CONVERT, E4M3)


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
def _seesaw_even_partition(
    q_lat_all, q_rope_smem, k_lat_smem, slots, chunk_ready,
    m_even, scale_even, m_odd, scale_odd, sum_odd, final_rows, query_unscale,
    CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, start, end, num_tiles, seqlen, q_len, tile, first_token, b, split,
    num_splits, scale_log2, kv_scale, OUT, LSE, PART_OUT, PART_LSE, OUT_STRIDES, LSE_STRIDES, PART_STRIDES, last,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, E4M3: gl.constexpr,
    LEFT_SCORES_AHEAD: gl.constexpr,
):
    """Warpgroup 0: S and the softmax of the even tiles (stage 0), output columns of the left half.
    Per pair of tiles: P0 against the running max updated with the even tile; O_L = O_L x scale0 +
    P0 . V0_L (P0 from registers); then, with the odd tile's max from warpgroup 1, P0 rescaled to it for warpgroup 1 and
    O_L = O_L x scale1 + P1 . V1_L. Each stage's chunks are reloaded as soon as their last reader is done.
    For fp8 pages the scores are multiplied by the query rows' unscale factors (`_scale_query`; the
    cache's scale is in scale_log2) and the output by the cache's scale, here. E4M3: S reads the e4m3 boxes, and
    each warpgroup converts the values it multiplies (its half of the columns of both tiles) once their S is done.
    With LEFT_SCORES_AHEAD (16-bit pages) the next pair's S over the left half of the latent columns is issued behind
    P1 . V1_L (its chunks were reloaded after P0 . V0_L), P1 . V1_L retired with it in flight and the odd stage's left
    half and rope reloaded before it is waited for; the pair then starts at the right half (NOTES.md v103)."""
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
    convert: gl.constexpr = FP8 and not E4M3
    gl.static_assert(not (LEFT_SCORES_AHEAD and FP8), "the left half of S goes ahead on 16-bit pages only")
    if FP8:
        row_unscale = query_unscale.load(gl.SliceLayout(1, s_layout))
    s = s_zero
    if LEFT_SCORES_AHEAD:
        if num_tiles > 0:  # the first pair's left half of S; later pairs' are issued behind the pair before's P1 . V1_L
            k0, _, q_lat_smem = _pair_views(0, k_lat_smem, q_lat_all)
            s = _even_left_scores(q_lat_smem, k0, chunk_ready, 0, s_zero, end - start, convert, E4M3)
            s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
    for pair in range(gl.cdiv(num_tiles, 2)):
        k0, k1, q_lat_smem = _pair_views(pair, k_lat_smem, q_lat_all)
        phase = pair & 1
        t0 = 2 * pair
        tok0 = start + t0 * BLOCK_N
        has_odd = t0 + 1 < num_tiles
        next_even = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t0 + 2, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        next_odd = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t0 + 3, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        if not FP8 and tok0 + BLOCK_N > end:  # (a left half's S issued ahead read them as they came: masked)
            _zero_tail(k0, chunk_ready, 0, phase, end - tok0)
        if not LEFT_SCORES_AHEAD:
            s = _even_left_scores(q_lat_smem, k0, chunk_ready, phase, s_zero, end - tok0, convert, E4M3)
        s = _scores_after_first_half(q_lat_smem, q_rope_smem, k0, slots.index(0), chunk_ready, 0, phase, s,
                                     end - tok0, False, FP8, E4M3)
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
        thread_barrier()
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
            pending = warpgroup_mma(slots.index(1), k1.slice(0, half, dim=1), acc, is_async=True)
            left_ahead = t0 + 2 < num_tiles if LEFT_SCORES_AHEAD else False
            if left_ahead:  # both branches reload: Gluon lets no MMA in flight out of a runtime `if`
                s = _even_left_scores(q_lat_smem, k0, chunk_ready, phase ^ 1, s_zero, end - tok0 - 2 * BLOCK_N,
                                      convert, E4M3)
                acc = warpgroup_mma_wait(num_outstanding=lat_chunks // 2, deps=[pending])  # S's MMAs still run
                thread_barrier()
                _load_chunks(CHUNK_DESC, ROPE_DESC, next_odd, chunk_ready, 1, k1, slots.index(1), 0, lat_chunks // 2,
                             True, t0 + 3 < num_tiles)
                s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=[pending])
                thread_barrier()
                _load_chunks(CHUNK_DESC, ROPE_DESC, next_odd, chunk_ready, 1, k1, slots.index(1), 0, lat_chunks // 2,
                             True, t0 + 3 < num_tiles)

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
    num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES, pieces,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, E4M3: gl.constexpr,
    PREFETCH_PAIRS: gl.constexpr,
):
    """Warpgroup 1: S and the softmax of the odd tiles (stage 1, computed while warpgroup 0 does its
    softmax), output columns of the right half: O_R = O_R x scale0 x scale1 + P1 . V1_R (P1 from
    registers), then + P0' . V0_R with warpgroup 0's rescaled P0. On 16-bit pages the second P . V is issued before
    the first is waited for, and warpgroup 0 issues its P1 . V1_L only behind both: the tensor cores take MMAs in
    issue order, and the even stage's right half, which warpgroup 0's next S reads, is reloaded once they are done
    (NOTES.md v69). Scores of fp8 pages, and E4M3's conversions, as in warpgroup 0. With PREFETCH_PAIRS > 0 it asks L2
    for the next unit's pieces (`next_unit_prefetch`) as the unit's pair that many from its end starts."""
    half: gl.constexpr = KV_LORA_RANK // 2
    lat_chunks: gl.constexpr = KV_LORA_RANK // TMA_CHUNK
    FP8: gl.constexpr = CHUNK_DESC.block_type.element_ty.is_fp8()
    s_layout: gl.constexpr = _score_layout(E4M3)
    o_layout: gl.constexpr = _half_output_layout(KV_LORA_RANK)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    dtype: gl.constexpr = slots.dtype
    row_width: gl.constexpr = KV_LORA_RANK + q_rope_smem.shape[1]  # of a query row (16-bit) and a cache row
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
        if PREFETCH_PAIRS > 0:
            if pair == gl.maximum(gl.cdiv(num_tiles, 2) - PREFETCH_PAIRS, 0):
                prefetch_to_l2(pieces, row_width * q_lat_all.dtype.primitive_bitwidth // 8,
                               row_width * CHUNK_DESC.block_type.element_ty.primitive_bitwidth // 8)
        next_even = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t1 + 1, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        next_odd = _cache_row(BLOCK_TABLE, bt_row, start + gl.minimum(t1 + 2, num_tiles - 1) * BLOCK_N, PAGE_SIZE)
        if has_odd:
            if not FP8 and tok1 + BLOCK_N > end:
                _zero_tail(k1, chunk_ready, 1, phase, end - tok1)
            s = _chunked_scores(q_lat_smem, q_rope_smem, k1, slots.index(1), chunk_ready, 1, phase, s_zero,
                                end - tok1, FP8, E4M3)
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
            thread_barrier()
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
        thread_barrier()
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
    OUT, and a split's partial in the output's dtype to PART_OUT, through the same columns of the query buffer,
    which neither warpgroup reads once both have passed their last S: the accumulator's layout would write each
    row in 4-byte pieces, half a sector at a time, and the programs of a batch that fills the GPU all store at
    once (NOTES.md v49, v95). A float32 partial, twice as wide, goes straight from the accumulator. (The next
    unit's Q arrives by cp.async, in the generic proxy like these stores; a TMA load of Q would need a proxy fence
    after the read-back.)"""
    # A Python `or`: for 16-bit partials the dtype test decides at compile time and the float32 branch is never traced
    # (`|` leaves a condition that folds to true, which triton 3.6 fails to lower).
    if PART_OUT.dtype.element_ty == OUT.dtype.element_ty or num_splits == 1:
        _store_staged(out, col0, q_lat_all, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                      OUT_STRIDES, PART_STRIDES, HEADS)
    else:
        _store_columns(out, col0, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                       OUT_STRIDES, PART_STRIDES, HEADS, LAYOUT)


@gluon.jit
def _store_staged(out, col0, q_lat_all, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                  OUT_STRIDES, PART_STRIDES, HEADS: gl.constexpr):
    """`_store_half`'s 16-bit values staged in the query buffer's columns col0 .. and stored in 16-byte row pieces
    (`store_output`: to OUT for a single split, else to the split's partial)."""
    gl.static_assert(OUT.dtype.element_ty.primitive_bitwidth == 16, "the staging buffer holds 16-bit values")
    staging = _as_dtype(q_lat_all.index(0), OUT.dtype.element_ty).slice(col0, out.shape[1], dim=1)
    pieces: gl.constexpr = row_piece_layout(out.shape[1])
    values = staged_in_row_pieces(staging, out.to(OUT.dtype.element_ty))
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, pieces))
    cols = col0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, pieces))
    store_output(values, rows[:, None], cols[None, :], OUT, PART_OUT, first_token, b, split, num_splits, q_len,
                 OUT_STRIDES, PART_STRIDES, HEADS)
