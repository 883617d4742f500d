"""The persistent seesaw kernel: at most one program per SM takes the plan's units (a split's row tile) in turn,
loads each unit's Q and first two tiles and runs the two warpgroups over it (`seesaw_partitions`); for batches that
fill the GPU the program that writes a sequence's last split merges its partials."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from mlakit.kernels.decode_split_plan import ORDER_SHARES, ORDER_TAKEN
from mlakit.kernels.gluon_compat import thread_barrier
from mlakit.kernels.hopper_common import (BLOCK_N, no_keys_yet, split_range, store_lse, store_output, take_unit,
                                          work_item)
from mlakit.kernels.hopper_decode.constants import (BLOCK_M, EARLY_TRIGGER_MAX_SPLITS, MERGE_COLUMNS, MERGE_LAYOUT,
                                                    MERGE_SPLITS_PER_STEP, TMA_CHUNK, WARPGROUP_ROWS)
from mlakit.kernels.hopper_decode.next_unit_prefetch import allocate_pieces, stage_next_unit
from mlakit.kernels.hopper_decode.seesaw_fp8 import _scale_query
from mlakit.kernels.hopper_decode.seesaw_loads import _as_dtype, _cache_row, _load_chunks, _separate_barriers
from mlakit.kernels.hopper_decode.seesaw_partitions import _seesaw_even_partition, _seesaw_odd_partition
from mlakit.kernels.hopper_decode.tile_helpers import _load_query
from mlakit.kernels.l2_evict_first import mark_evict_first


# row_tiles is not specialized on being a multiple of 16: an extend's row tiles follow its longest segment, and a
# serving step's extend must find the kernel the warm-up's extends compiled (its value 1 stays specialized).
@gluon.jit(do_not_specialize=["stride_bt_b", "work_rows"], do_not_specialize_on_alignment=["row_tiles"])
def mla_decode_hopper_seesaw_kernel(
    Q, CHUNK_DESC, ROPE_DESC, KV_SCALE, BLOCK_TABLE, SEQLENS, WORK,
    OUT, LSE, PART_OUT, PART_LSE,
    scale_log2,
    Q_STRIDES, KV_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES,
    WORK_STATE, work_rows, row_tiles, MERGE_STATE, KV, kv_row_stride,
    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr,
    KV_LORA_RANK: gl.constexpr, ROPE_DIM: gl.constexpr, MERGE: gl.constexpr, SHARES_TO_COMBINE: gl.constexpr,
    EVICT_FIRST: gl.constexpr, E4M3_SCORES: gl.constexpr, PREFETCH_PAIRS: gl.constexpr,
    LEFT_SCORES_AHEAD: gl.constexpr,
):
    """Two warpgroups taking turns over tile pairs ("seesaw"), for 16-bit pages that hold whole tiles:
    even tiles in stage 0 (warpgroup 0's S and softmax), odd tiles in stage 1 (warpgroup 1's), each
    warpgroup owning half of the output columns and using the other's P through shared memory, so one
    warpgroup's softmax runs while the other's MMAs do. Tiles arrive as two latent halves and the rope,
    each on its own barrier. Persistent: a launch of at most one program per SM takes the plan's units (a work item's
    row tile; WORK_STATE[0] items of row_tiles units each, in a plan of work_rows rows), unit p first for
    program p, so that no program waits behind programs that find no work; then, for a ragged batch
    (WORK_STATE[2] is ORDER_TAKEN), the next untaken one as each program finishes one (`take_unit`: the shorter
    splits fill in where programs finish first), otherwise in snake order (program p's second unit is the p-th
    from the end of the second round, ...; an equal-share plan's rows follow it, `decode_share_plan`), each unit's
    plan entry loaded while the one before runs (NOTES.md v30); a unit's KV range is read from its plan entry as it
    starts. With MERGE, a split's partial is counted in MERGE_STATE once written, and the program
    that writes a sequence's last split merges the partials (`_merge_if_last`) instead of a combine kernel; with
    SHARES_TO_COMBINE too, but for an equal-share plan (WORK_STATE[2] is ORDER_SHARES), whose partials the combine
    launched behind merges. In a non-ragged plan a program past its last unit's tile loop executes
    `launch_dependents` where that unit's sequence has at most EARLY_TRIGGER_MAX_SPLITS splits (only a combine
    launched behind this kernel reacts to it); otherwise the programs let it launch as they exit. With EVICT_FIRST
    the cache's TMA loads carry an L2 evict-first policy (`l2_evict_first`; the launch rewrites the PTX). With
    E4M3_SCORES (fp8 pages) the query rows are rounded to e4m3 and S runs on 8-bit tensor cores over the boxes as
    TMA put them; only the values P multiplies are converted, after their S. With PREFETCH_PAIRS > 0, in a
    non-ragged plan, warpgroup 1 asks L2 for the next unit's query rows and first two KV tiles (rows of the cache `KV`,
    `kv_row_stride` elements apart) that many tile pairs before this unit's end (`next_unit_prefetch`). With
    LEFT_SCORES_AHEAD (16-bit pages) warpgroup 0 issues each next tile pair's left half of S behind its last P . V
    (`seesaw_partitions`).
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
    pieces = allocate_pieces() if PREFETCH_PAIRS > 0 else None

    if FP8:
        kv_scale = gl.load(KV_SCALE)
    else:
        kv_scale = 1.0
    scale_log2 = scale_log2 * kv_scale
    units = gl.load(WORK_STATE) * row_tiles
    programs = gl.num_programs(0)
    order = gl.load(WORK_STATE + 2)
    ragged = order == ORDER_TAKEN
    if SHARES_TO_COMBINE:
        merges_here = order != ORDER_SHARES
    else:
        merges_here = True
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
        if PREFETCH_PAIRS > 0:
            prefetch = (pieces, KV, kv_row_stride, next_work, next_unit, units, ragged, row_tiles, work_rows)
        else:
            prefetch = (None,)
        if _runs((b, split, num_splits, first_token, q_len, seqlen), tile, HEADS):
            _seesaw_unit(
                q_lat_all, q_rope_smem, k_lat_smem, slots, rows_smem, chunk_ready,
                Q, CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, seqlen, WORK, unit // row_tiles, b, split, num_splits,
                first_token, q_len, tile, OUT, LSE, PART_OUT, PART_LSE, scale_log2, kv_scale, Q_STRIDES, stride_bt_b,
                OUT_STRIDES, LSE_STRIDES, PART_STRIDES, last, prefetch, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3_SCORES,
                PREFETCH_PAIRS, LEFT_SCORES_AHEAD)
            if MERGE and num_splits > 1:
                if merges_here:
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
    thread_barrier()
    if gl.atomic_add(arrivals, 1) == num_splits - 1:
        gl.store(arrivals, 0)
        gl.static_assert(KV_LORA_RANK % MERGE_COLUMNS == 0, "the merge's blocks cover the latent columns")
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
                           cache_modifier=".cg").to(gl.float32)
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
def _unit_item(unit, row_tiles, work_rows):
    """The plan row of a unit's work item (a unit past the plan's rows reads the last row)."""
    return gl.minimum(unit // row_tiles, work_rows - 1)


@gluon.jit
def _unit_work(WORK, SEQLENS, unit, row_tiles, work_rows):
    """`work_item` of the unit's item and the sequence's length (a unit past the plan's rows reads the
    last row instead; the caller never runs units past the plan's items)."""
    b, split, num_splits, first_token, q_len = work_item(WORK, _unit_item(unit, row_tiles, work_rows))
    return b, split, num_splits, first_token, q_len, gl.load(SEQLENS + b)


@gluon.jit
def _runs(work, tile, HEADS: gl.constexpr):
    """Whether a unit (its `_unit_work` and row tile) has work: a split its sequence has, query rows in its tile."""
    b, split, num_splits, first_token, q_len, seqlen = work
    return (split < num_splits) & (tile * BLOCK_M < q_len * HEADS)


@gluon.jit
def _stage_next_unit(prefetch, Q, BLOCK_TABLE, WORK, Q_STRIDES, stride_bt_b, HEADS: gl.constexpr,
                     PAGE_SIZE: gl.constexpr):
    """`stage_next_unit` for the program's next unit in a non-ragged plan (`prefetch`: the shared buffer, the cache,
    its row stride, the next unit's `_unit_work`, the next unit, the plan's units, whether it is ragged, its row tiles
    and rows); a ragged plan's next unit is not known."""
    pieces, KV, kv_row_stride, next_work, next_unit, units, ragged, row_tiles, work_rows = prefetch
    tile = next_unit % row_tiles
    runs = (not ragged) & (next_unit < units) & _runs(next_work, tile, HEADS)
    stage_next_unit(pieces, Q, KV, BLOCK_TABLE, WORK, next_work, _unit_item(next_unit, row_tiles, work_rows), tile, runs,
                    Q_STRIDES, kv_row_stride, stride_bt_b, HEADS, PAGE_SIZE)


@gluon.jit
def _seesaw_unit(
    q_lat_all, q_rope_smem, k_lat_smem, slots, rows_smem, chunk_ready,
    Q, CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, seqlen, WORK, item, b, split, num_splits, first_token, q_len, tile,
    OUT, LSE, PART_OUT, PART_LSE, scale_log2, kv_scale, Q_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES,
    last, prefetch, HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr, KV_LORA_RANK: gl.constexpr, E4M3: gl.constexpr,
    PREFETCH_PAIRS: gl.constexpr, LEFT_SCORES_AHEAD: gl.constexpr,
):
    """One unit of the seesaw kernel (a row tile of the plan's work item `item`), on chunk barriers initialized
    for it and invalidated after it: Q and the first two tiles loaded, then (PREFETCH_PAIRS > 0) the next unit's
    prefetch addresses staged (`_stage_next_unit`, `prefetch` its arguments), then the two warpgroups' partitions."""
    start, end, num_tiles = split_range(WORK, item, seqlen)
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
    if PREFETCH_PAIRS > 0:  # behind this unit's own loads: the next unit's plan entry may still be loading
        _stage_next_unit(prefetch, Q, BLOCK_TABLE, WORK, Q_STRIDES, stride_bt_b, HEADS, PAGE_SIZE)
    async_copy.wait_group(0)
    query_unscale = rows_smem.index(6)
    if FP8:
        thread_barrier()
        _scale_query(q_lat_all.index(0), q_rope_smem, q_dtype, query_unscale, E4M3)
    fence_async_shared()
    thread_barrier()

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
            PART_STRIDES, last, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3, LEFT_SCORES_AHEAD)),
        (_seesaw_odd_partition, (
            q_lat_all, q_rope_smem, k_lat_smem, slots, chunk_ready,
            m_even, scale_even, m_odd, scale_odd, sum_odd, final_rows, query_unscale,
            CHUNK_DESC, ROPE_DESC, BLOCK_TABLE, bt_row, start, end, num_tiles, seqlen, q_len, tile, first_token, b, split,
            num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES, prefetch[0],
            HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3, PREFETCH_PAIRS)),
    ], [4], [248])
    for c in gl.static_range(len(chunk_ready)):
        mbarrier.invalidate(chunk_ready[c])
