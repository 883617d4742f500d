"""Hopper (SM90) MHA-form MLA prefill in Gluon: TMA loads by a producer warp, wgmma in two
consumer warpgroups.

The contract of `triton_prefill.triton_mha_prefill` (varlen segments, bottom-right causal
alignment, lse out, the merge into an earlier out / lse of a disjoint key set) for 16-bit
q, k and v of one dtype, d_nope 64 or 128, d_rope 32 or 64, d_v 64 or 128 (DeepSeek's 128 +
64 / 128 and MiniCPM3's 64 + 32 / 64), every row stride 16-byte aligned.

One program owns 128 query rows of one head of one segment:

- the producer (one warp) loads the program's Q once, then each tile of BLOCK_N keys into two
  STAGES-deep rings, its K (K_nope and the shared K_pe) into the K ring and its V into the V ring,
  in the order the consumers use them (K_t with V_{t-1}), all by TMA in boxes of at most 64 columns;
  each completes on its stage's `ready` barrier. Keys past the last segment arrive as zeros, keys
  of the next segment are masked like keys past the segment's end;
- two consumer warpgroups take 64 of the rows each. Per tile a warpgroup issues S_t = Q_nope
  K_nope^T + Q_pe K_pe^T (from shared memory) together with the previous tile's deferred
  O += P_{t-1} V_{t-1} (P from registers), then runs the softmax of S_t (base 2) while the other
  warpgroup issues its pair: the two take turns on named barriers (FA3's ping-pong). A K stage goes
  back to the producer (a named barrier both warpgroups arrive on) once both S of it are done, a V
  stage once both P V of it are, a tile earlier for K than one ring would allow: two stages of 128
  keys each keep the loads as far ahead as three of one ring did. Tiles every row of a warpgroup
  fully sees skip the mask; a warpgroup waits for and releases every tile, computing only those its
  rows can see.

The persistent form (`mha_prefill_hopper_persistent_kernel`, tuning kernel "hopper_persistent") runs one
program per SM over the same work units (row block, head, segment), heaviest first (`_unit` gives the order):
program p starts on unit p, and its producer takes each later one from a global counter once it has issued a
unit's loads (`take_unit`; the launch holds the counter), publishing it to the consumers through shared
memory, so it loads the next unit's Q and first tiles while the consumers store the last unit's rows.

`triton_mha_prefill` runs the persistent form (128-key tiles, 2 stages a ring) by default wherever `supports`
holds, except on passes of at most half as many units as SMs, which take one program per row block with the same
tiles (benchmarks/NOTES.md, p5-p11: on an H100 the Hopper tier is 1.05-1.17x faster than the portable kernel,
the persistent form 4-15% faster than one program per row block, and the split rings with 128-key tiles
10-16% faster again on long prompts and prefixes; p31: with no second unit to take, the persistent form's
hand-over only costs).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                             warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mlakit.kernels.gluon_compat import thread_barrier, tma_load
from mlakit.kernels.hopper_common import (GLUON_DTYPES, Matrix, capability, finish_rows, matrix_descriptor, no_keys_yet,
                                          hand_over, named_barrier_at, online_softmax, row_piece_layout,
                                          staged_in_row_pieces,
                                          take_over, take_unit, zero_rows_from)
from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.device import sm_count
from mlakit.errors import MLAInputError
from mlakit.kernels.launch import CachedLaunch
from mlakit.kernels.triton_prefill import HOPPER_MAX_STAGES, merged_with_earlier, program_segment

# Query rows of one program and of one consumer warpgroup.
BLOCK_M = 128
WARPGROUP_ROWS = gl.constexpr(64)
# Widest TMA box row (the 128-byte swizzle's span: 64 16-bit values, 128 e4m3 ones).
TMA_BYTES = 128
NOPE_DIMS = frozenset({64, 128})
ROPE_DIMS = frozenset({32, 64})
V_DIMS = frozenset({64, 128})
# Named barriers the two consumer warpgroups take turns on. Triton 3.6 takes id 0 (the default partition),
# 1 (start / stop) and 2 + i for partition i of the padded partitions (4 here: ids up to 5), so 8 and 9 are free.
TURN_BARRIERS = gl.constexpr((8, 9))
# One warpgroup zeroing V rows past a segment's end, 64 columns at a time, 16 bytes per thread and row.
ZERO_CHUNK = gl.constexpr(64)
# Rows of the e4m3 kernel's all-ones operand: P times it gives each row's sum of P (`_row_sums`), the least N of a wgmma.
SUM_COLUMNS = gl.constexpr(8)
E4M3_ONE = gl.constexpr(0x38)  # 1.0: sign 0, exponent 7 (the bias), mantissa 0
ZERO_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
# The same for fp8 V, transposed (`_load_values`): 64 of its value rows at a time, 16 bytes per thread and row.
ZERO_T_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0]))
# Named barriers that give a stage back to the producer, both consumer warpgroups arriving and the producer warp
# waiting: K ring stage s on FIRST_RELEASE_BARRIER + s, V ring stage s on FIRST_RELEASE_BARRIER + HOPPER_MAX_STAGES + s
# (ids up to 15).
FIRST_RELEASE_BARRIER = gl.constexpr(10)
RING_BARRIERS = gl.constexpr(HOPPER_MAX_STAGES)
K_RING = gl.constexpr(0)
V_RING = gl.constexpr(1)
RELEASE_THREADS = gl.constexpr(2 * 128 + 32)
# Shared memory a program may take on an H100 (227 KiB).
SHARED_MEMORY_LIMIT = 232448
# Key bytes (K_nope and V) of the heads whose units the persistent kernel runs together: within an H100's 50 MiB L2.
L2_KEY_BYTES = 32 * 2**20
# Fields of a unit the persistent kernel's producer publishes to the consumers (`_publish_unit`).
UNIT_FIELDS = gl.constexpr(7)
# Where a consumer warpgroup's output rows pass on their way out (`_store_rows`): its half of the Q buffer, the
# first rows of the unit's last K stage, or nowhere (stored from the accumulator's layout).
STAGE_IN_Q = gl.constexpr(0)
STAGE_IN_K = gl.constexpr(1)
NO_STAGING = gl.constexpr(2)


def supports(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the Hopper kernel takes these operands: an SM90 GPU, one 16-bit dtype (or e4m3 with v given
    transposed: `value_matrix`), supported widths, and addresses and row / head strides TMA can use (16-byte
    multiples)."""
    tensors = (q, k_nope, k_pe, v)
    if q.device.type != "cuda" or capability(q.device)[0] != 9 or q.dtype not in (*GLUON_DTYPES, FP8_DTYPE):
        return False
    if any(t.dtype != q.dtype or t.device != q.device or t.stride(-1) != 1 for t in tensors):
        return False
    if q.dtype == FP8_DTYPE and (v.dim() != 3 or v.stride(0) != v.shape[1] * v.stride(1)):
        return False
    widths_ok = (k_nope.shape[-1] in NOPE_DIMS and k_pe.shape[-1] in ROPE_DIMS and value_width(v) in V_DIMS
                 and q.shape[-1] == k_nope.shape[-1] + k_pe.shape[-1])
    strides = [s for t in tensors for s in t.stride()[:-1]]
    columns_ok = all(head_rows(t)[2][1] < 2**31 for t in (q, k_nope, k_pe))  # TMA's int32 column coordinates
    return (widths_ok and columns_ok and value_matrix(v)[2][0] < 2**31 and all(t.data_ptr() % 16 == 0 for t in tensors)
            and all(s * q.element_size() % 16 == 0 for s in strides))


def value_width(v: torch.Tensor) -> int:
    """d_v of the values: `v [Tk, H, d_v]`, or for e4m3 `v [H, d_v, Tk]` (transposed)."""
    return v.shape[1] if v.dtype == FP8_DTYPE else v.shape[-1]


def value_matrix(v: torch.Tensor) -> Matrix:
    """The values as the matrix the kernel reads: `head_rows(v)` for 16-bit `v [Tk, H, d_v]`; for e4m3 `v [H, d_v, Tk]`
    (keys contiguous, heads one after another) its H * d_v rows of Tk keys."""
    if v.dtype != FP8_DTYPE:
        return head_rows(v)
    return v.data_ptr(), v.dtype, (v.shape[0] * v.shape[1], v.shape[2]), (v.stride(1), 1)


@gluon.jit
def _load_q(q_nope_smem, q_pe_smem, q_ready, Q_DESC, QPE_DESC, q_row, q_col, buffer, NOPE_DIM: gl.constexpr):
    """Q's two warpgroup halves (rows q_row .., columns q_col ..) into Q buffer `buffer`, completing on `q_ready`."""
    nope_chunk: gl.constexpr = Q_DESC.block_type.shape[1]
    q_bytes: gl.constexpr = 2 * ((NOPE_DIM // nope_chunk) * Q_DESC.block_type.nbytes + QPE_DESC.block_type.nbytes)
    mbarrier.expect(q_ready, q_bytes)
    for half in gl.static_range(2):
        row = q_row + half * WARPGROUP_ROWS
        q_nope = q_nope_smem.index(buffer * 2 + half)
        for c in gl.static_range(NOPE_DIM // nope_chunk):
            tma_load(Q_DESC, [row, q_col + c * nope_chunk], q_ready,
                     q_nope.slice(c * nope_chunk, nope_chunk, dim=1))
        tma_load(QPE_DESC, [row, q_col + NOPE_DIM], q_ready, q_pe_smem.index(buffer * 2 + half))


@gluon.constexpr_function
def _is_fp8(dtype):
    """Whether the kernel runs on e4m3 operands (V transposed: `_load_values`, `_values`)."""
    return dtype == gl.float8e4nv


@gluon.constexpr_function
def _accumulator_layout(width, dtype):
    """Register layout of a warpgroup's `[64, width]` wgmma accumulator over `dtype` operands (K 32 for 8-bit)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, width, 32 if _is_fp8(dtype) else 16])


@gluon.jit
def _values(v_smem, stage):
    """V stage `stage` as P V's `[keys, V_DIM]` operand (fp8 V is held transposed, keys along its rows: wgmma
    reads 8-bit operands K-major only)."""
    if _is_fp8(v_smem.dtype):
        return v_smem.index(stage).permute((1, 0))
    else:
        return v_smem.index(stage)


@gluon.jit
def _value_key(column):
    """The key in column `column` of an e4m3 V^T tile: within each group of 16, column 4a + 2b + c holds key
    8b + 2a + c (`fp8.value_columns`' order, `_p_operand`)."""
    return column - column % 16 + 8 * ((column >> 1) & 1) + 2 * ((column >> 2) & 3) + (column & 1)


@gluon.jit
def _zero_values_from(v_t, first_bad, CHUNK: gl.constexpr, LAYOUT: gl.constexpr):
    """The columns of e4m3 V^T tile `v_t` that hold keys first_bad .. set to zero, CHUNK value rows at a time
    (`zero_rows_from` for the transposed tile, its keys in `_value_key`'s order)."""
    keys = _value_key(gl.arange(0, v_t.shape[1], layout=gl.SliceLayout(0, LAYOUT)))
    for c in gl.static_range(v_t.shape[0] // CHUNK):
        part = v_t.slice(c * CHUNK, CHUNK, dim=0)
        values = part.load(LAYOUT)
        part.store(gl.where((keys < first_bad)[None, :], values, gl.zeros_like(values)))


@gluon.jit
def _p_carried(p, dtype: gl.constexpr, p_layout: gl.constexpr):
    """A tile's probabilities (float32, the scores' layout) as the loop carries them to the next tile's P V:
    16-bit P already as the MMA's register operand; e4m3 P still in float32, rounded by `_p_operand` where the MMA
    is issued (carried as bytes, the compiler unpacks and repacks them one by one)."""
    if _is_fp8(dtype):
        return p
    else:
        return gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _p_operand(p, dtype: gl.constexpr, p_layout: gl.constexpr):
    """P V's register operand from `_p_carried`'s P. e4m3 P goes in `_value_key`'s order: within each group of
    16 keys, operand column 4a + 2b + c holds key 8b + 2a + c, a score its thread already holds, so no value moves
    between threads (v_t stores its keys in that order: `fp8.value_columns`), and each four of a thread's scores
    round into one register."""
    if _is_fp8(dtype):
        rows: gl.constexpr = p.shape[0]
        cols: gl.constexpr = p.shape[1]
        grouped = gl.permute(gl.reshape(p, [rows, cols // 16, 2, 4, 2]), (0, 1, 3, 2, 4))
        operand = gl.convert_layout(gl.reshape(grouped, [rows, cols]), p_layout, assert_trivial=True)
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
            " mov.b32 $0, {lo, hi}; }", "=r,r,r,r,r", [operand], dtype=gl.float8e4nv, is_pure=True, pack=4)
    else:
        return p


@gluon.jit
def _operand_scales(SCALES, scale_log2, FP8: gl.constexpr):
    """The score factor (base 2) and the output factor: with FP8, `scale_log2` times q's and k's scales
    (SCALES[0], their product) and v's (SCALES[1]), read on the device; else `scale_log2` and 1."""
    if FP8:
        return scale_log2 * gl.load(SCALES), gl.load(SCALES + 1)
    else:
        return scale_log2, 1.0


@gluon.jit
def _release_stage(stage, RING: gl.constexpr):
    """A consumer warpgroup gives stage `stage` of ring RING (K_RING or V_RING) back to the producer: each thread
    arrives on the stage's named barrier once its own reads of the stage are done (its MMA waits). A named barrier
    touches no shared memory, so the compiler adds no barrier of its own around it (it puts two around an
    mbarrier arrive)."""
    named_barrier_at(_release_barrier(stage, RING), "arrive", RELEASE_THREADS)


@gluon.jit
def _wait_for_stage(stage, RING: gl.constexpr):
    """The producer waits until both consumers gave stage `stage` of ring RING back (`_release_stage`)."""
    named_barrier_at(_release_barrier(stage, RING), "sync", RELEASE_THREADS)


@gluon.jit
def _release_barrier(stage, RING: gl.constexpr):
    """The named barrier that gives stage `stage` of ring RING back to the producer."""
    return FIRST_RELEASE_BARRIER + RING * RING_BARRIERS + stage


@gluon.jit
def _drain_stages(total_tiles, STAGES: gl.constexpr):
    """The producer's waits for both rings' last `STAGES` releases, which no reload waits for: every named barrier
    the consumers arrived on is completed before the program ends."""
    for count in range(gl.maximum(total_tiles - STAGES, 0), total_tiles):
        _wait_for_stage(count % STAGES, K_RING)
        _wait_for_stage(count % STAGES, V_RING)


@gluon.jit
def _load_tiles(kn_smem, kpe_smem, v_smem, k_ready, v_ready, KN_DESC, KPE_DESC, V_DESC, k_row, kn_col, v_col,
                first_tile, num_tiles, NOPE_DIM: gl.constexpr, V_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr):
    """Key tiles 0 .. num_tiles of a program into the two rings, in the order the consumers need them: K_0, then
    K_t and V_{t-1} (tile t's S and the previous tile's deferred P V), then the last V. `first_tile` counts the
    rings' earlier tiles (stages and phases follow the running count; a stage is reloaded once both consumers
    released it: K after its S, V after its P V, so K stages come back a tile earlier than V ones)."""
    for t in range(num_tiles):
        _load_keys(kn_smem, kpe_smem, k_ready, KN_DESC, KPE_DESC, k_row + t * BLOCK_N, kn_col, first_tile + t,
                   NOPE_DIM, STAGES)
        if t > 0:
            _load_values(v_smem, v_ready, V_DESC, k_row + (t - 1) * BLOCK_N, v_col, first_tile + t - 1, V_DIM, STAGES)
    if num_tiles > 0:
        _load_values(v_smem, v_ready, V_DESC, k_row + (num_tiles - 1) * BLOCK_N, v_col, first_tile + num_tiles - 1,
                     V_DIM, STAGES)


@gluon.jit
def _load_keys(kn_smem, kpe_smem, k_ready, KN_DESC, KPE_DESC, row, kn_col, count, NOPE_DIM: gl.constexpr,
               STAGES: gl.constexpr):
    """The ring's `count`-th K tile (K_nope and K_pe of key rows row ..) into its K stage, completing on k_ready."""
    nope_chunk: gl.constexpr = KN_DESC.block_type.shape[1]
    k_bytes: gl.constexpr = (NOPE_DIM // nope_chunk) * KN_DESC.block_type.nbytes + KPE_DESC.block_type.nbytes
    stage = count % STAGES
    if count >= STAGES:
        _wait_for_stage(stage, K_RING)
    bar = k_ready.index(stage)
    mbarrier.expect(bar, k_bytes)
    for c in gl.static_range(NOPE_DIM // nope_chunk):
        tma_load(KN_DESC, [row, kn_col + c * nope_chunk], bar,
                 kn_smem.index(stage).slice(c * nope_chunk, nope_chunk, dim=1))
    tma_load(KPE_DESC, [row, 0], bar, kpe_smem.index(stage))


@gluon.jit
def _load_values(v_smem, v_ready, V_DESC, row, v_col, count, V_DIM: gl.constexpr, STAGES: gl.constexpr):
    """The ring's `count`-th V tile (key rows row ..) into its V stage, completing on v_ready. fp8 values come
    transposed (`V_DESC` over V^T: a head's V_DIM rows from v_col, key columns from row), in one box."""
    stage = count % STAGES
    if count >= STAGES:
        _wait_for_stage(stage, V_RING)
    bar = v_ready.index(stage)
    if _is_fp8(V_DESC.block_type.element_ty):
        mbarrier.expect(bar, V_DESC.block_type.nbytes)
        tma_load(V_DESC, [v_col, row], bar, v_smem.index(stage))
    else:
        v_chunk: gl.constexpr = V_DESC.block_type.shape[1]
        mbarrier.expect(bar, (V_DIM // v_chunk) * V_DESC.block_type.nbytes)
        for c in gl.static_range(V_DIM // v_chunk):
            tma_load(V_DESC, [row, v_col + c * v_chunk], bar,
                     v_smem.index(stage).slice(c * v_chunk, v_chunk, dim=1))


@gluon.jit
def _producer(q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, q_ready, k_ready, v_ready,
              Q_DESC, QPE_DESC, KN_DESC, KPE_DESC, V_DESC, q_row, q_col, k_row, kn_col, v_col, num_tiles,
              NOPE_DIM: gl.constexpr, V_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Q's two warpgroup halves, then the key tiles into the ring (stage t % STAGES reloaded once
    both consumers released it)."""
    _load_q(q_nope_smem, q_pe_smem, q_ready.index(0), Q_DESC, QPE_DESC, q_row, q_col, 0, NOPE_DIM)
    _load_tiles(kn_smem, kpe_smem, v_smem, k_ready, v_ready, KN_DESC, KPE_DESC, V_DESC, k_row, kn_col, v_col,
                0, num_tiles, NOPE_DIM, V_DIM, BLOCK_N, STAGES)
    _drain_stages(num_tiles, STAGES)


@gluon.jit
def _consumer(q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready, k_ready, v_ready,
              OUT, LSE, SCALES, q_start, q_len, k_len, m0, head, num_tiles, scale_log2,
              stride_o_tok, stride_o_head, stride_lse_tok,
              HALF: gl.constexpr, V_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, MERGE: gl.constexpr):
    """Rows m0 + HALF * 64 .. + 64 of the program: attention over the tiles they see, then the
    store (merged into the earlier result with MERGE)."""
    scale_log2, v_scale = _operand_scales(SCALES, scale_log2, _is_fp8(q_nope_smem.dtype))
    acc, m_i, l_i = _attend_rows(q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready.index(0), k_ready,
                                 v_ready, q_len, k_len, m0, num_tiles, 0, 0, 0, scale_log2, q_ready.index(0),
                                 q_ready.index(0), HALF, V_DIM, BLOCK_N, STAGES, CAUSAL, False)
    _store_rows(acc, m_i, l_i, v_scale, q_nope_smem, kn_smem, q_ready.index(0), OUT, LSE, q_start, q_len, m0, head, 0, 0,
                stride_o_tok, stride_o_head, stride_lse_tok, HALF, V_DIM, MERGE, STAGE_IN_Q, False)


@gluon.jit
def _attend_rows(q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready, k_ready, v_ready,
                 q_len, k_len, m0, num_tiles, first_tile, q_phase, q_buffer, scale_log2, q_free, k_read,
                 HALF: gl.constexpr, V_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 CAUSAL: gl.constexpr, EARLY_Q_BACK: gl.constexpr):
    """Rows m0 + HALF * 64 .. + 64 over the program's num_tiles key tiles: the unnormalized output,
    running max and sum. `first_tile` counts the rings' earlier tiles, `q_phase` is the phase of Q buffer
    `q_buffer`'s `q_ready`. With EARLY_Q_BACK the second warpgroup gives Q back (`q_free`) once its last S
    is done and keeps the unit's last K stage for its rows' way out (`_store_rows`, STAGE_IN_K: it gives the
    stage back there), and the first warpgroup tells it on `k_read` when its own S are done.

    Per tile t the warpgroup issues S_t = Q K_t^T and the deferred P_{t-1} V_{t-1} together, then
    runs the softmax of S_t while the other warpgroup's pair runs: the two take turns on named
    barriers (one turn per tile of the program, computed or not, so both take the same number).
    K_t goes back to the producer once S_t is done, V_t once P_t V_t is; a tile the warpgroup does not
    compute goes back once it has landed (a stage is reloaded only after its load completed)."""
    fp8: gl.constexpr = _is_fp8(q_nope_smem.dtype)
    s_layout: gl.constexpr = _accumulator_layout(BLOCK_N, q_nope_smem.dtype)
    o_layout: gl.constexpr = _accumulator_layout(V_DIM, q_nope_smem.dtype)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if fp8 else 2)
    my_turn: gl.constexpr = TURN_BARRIERS[HALF]
    keeps_last_k: gl.constexpr = EARLY_Q_BACK and HALF == 1  # released by `_store_rows` (STAGE_IN_K)
    their_turn: gl.constexpr = TURN_BARRIERS[1 - HALF]
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    row0 = m0 + HALF * WARPGROUP_ROWS
    rows = row0 + gl.arange(0, WARPGROUP_ROWS, layout=rows_layout)
    offset = k_len - q_len
    if CAUSAL:
        seen_hi = gl.minimum(k_len, row0 + WARPGROUP_ROWS + offset)
        unmasked_hi = gl.maximum(gl.minimum(k_len, row0 + offset + 1), 0) // BLOCK_N * BLOCK_N
    else:
        seen_hi = k_len
        unmasked_hi = k_len // BLOCK_N * BLOCK_N
    # The tiles this warpgroup computes: a prefix of the program's (rows past the segment compute none).
    my_tiles = gl.where(row0 < q_len, gl.cdiv(gl.maximum(seen_hi, 0), BLOCK_N), 0)
    m_i, l_i = no_keys_yet(WARPGROUP_ROWS, rows_layout)
    acc = gl.zeros([WARPGROUP_ROWS, V_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([WARPGROUP_ROWS, BLOCK_N], gl.float32, layout=s_layout)
    p = _p_carried(s_zero, q_nope_smem.dtype, p_layout)
    q_nope = q_nope_smem.index(q_buffer * 2 + HALF)
    q_pe = q_pe_smem.index(q_buffer * 2 + HALF)
    if HALF == 1:
        hand_over(TURN_BARRIERS[0])  # the first turn is the first warpgroup's
    mbarrier.wait(q_ready, q_phase)
    for t in range(num_tiles):
        count = first_tile + t
        stage = count % STAGES
        phase = (count // STAGES) & 1
        previous = (count + STAGES - 1) % STAGES
        computes = t < my_tiles
        mbarrier.wait(k_ready.index(stage), phase)
        if t > 0 and t <= my_tiles:
            mbarrier.wait(v_ready.index(previous), ((count - 1) // STAGES) & 1)
        # V rows past the segment: P is 0 there, but 0 * NaN is not. The second warpgroup zeroes them (whether
        # or not it computes the tile) before its turn; every P V of the tile comes after that turn.
        zeroes_tail = HALF == 1 and (t + 1) * BLOCK_N > k_len
        if zeroes_tail or not computes:
            mbarrier.wait(v_ready.index(stage), phase)
        if zeroes_tail:
            if fp8:
                _zero_values_from(v_smem.index(stage), k_len - t * BLOCK_N, ZERO_CHUNK, ZERO_T_LAYOUT)
            else:
                zero_rows_from(v_smem.index(stage), k_len - t * BLOCK_N, ZERO_CHUNK, ZERO_LAYOUT)
            fence_async_shared()
            thread_barrier()
        # The turn covers issuing this tile's MMAs; they run on while the other warpgroup issues its own.
        take_over(my_turn)
        s = s_zero
        if computes:
            s_mma = warpgroup_mma(q_nope, kn_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_mma = warpgroup_mma(q_pe, kpe_smem.index(stage).permute((1, 0)), s_mma, is_async=True)
            if t > 0:
                p_op = _p_operand(p, q_nope_smem.dtype, p_layout)
                acc_mma = warpgroup_mma(p_op, _values(v_smem, previous), acc, is_async=True)
                if fp8:
                    sums_mma = _row_sums(ones, p_op)
                    hand_over(their_turn)
                    s, acc, sums = warpgroup_mma_wait(num_outstanding=0, deps=[s_mma, acc_mma, sums_mma])
                    l_i += _row_sums_done(sums, rows_layout)
                else:
                    hand_over(their_turn)
                    s, acc = warpgroup_mma_wait(num_outstanding=0, deps=[s_mma, acc_mma])
            else:
                hand_over(their_turn)
                s = warpgroup_mma_wait(num_outstanding=0, deps=[s_mma])
        elif t > 0 and t == my_tiles:
            acc, l_i = _last_p_v(p, v_smem, previous, acc, l_i, ones, p_layout, rows_layout, their_turn, True)
        else:
            hand_over(their_turn)
        if t < num_tiles - 1 or not keeps_last_k:
            _release_stage(stage, K_RING)
        if t > 0 and t <= my_tiles:
            _release_stage(previous, V_RING)
        if not computes:
            _release_stage(stage, V_RING)
        else:
            if t * BLOCK_N + BLOCK_N > unmasked_hi:
                keys = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                seen = keys[None, :] < k_len
                if CAUSAL:
                    seen = seen & (keys[None, :] <= (rows + offset)[:, None])
                s = gl.where(seen, s, float("-inf"))
            p_tile, alpha, m_i = online_softmax(s, m_i, 1, scale_log2)
            if fp8:  # P's row sums come with its P V (`_row_sums`)
                l_i = l_i * alpha
            else:
                l_i = l_i * alpha + gl.sum(p_tile, 1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p = _p_carried(p_tile, q_nope_smem.dtype, p_layout)
    if EARLY_Q_BACK and HALF == 1:
        _give_q_back(q_free)
    if HALF == 0:
        take_over(my_turn)  # the second warpgroup's last hand-over
        if EARLY_Q_BACK:  # after that hand-over, so that its arrivals never run two units ahead of the waits
            mbarrier.arrive(k_read, count=1)
    if my_tiles > 0 and my_tiles == num_tiles:  # the last tile's P V, deferred past the loop
        last_count = first_tile + num_tiles - 1
        last = last_count % STAGES
        mbarrier.wait(v_ready.index(last), (last_count // STAGES) & 1)
        acc, l_i = _last_p_v(p, v_smem, last, acc, l_i, ones, p_layout, rows_layout, their_turn, False)
        _release_stage(last, V_RING)
    return acc, m_i, l_i


@gluon.jit
def _last_p_v(p, v_smem, stage, acc, l_i, ones, p_layout: gl.constexpr, rows_layout: gl.constexpr, their_turn,
              HAND_OVER: gl.constexpr):
    """A warpgroup's P V of its last tile (after it, with HAND_OVER, the turn goes to the other warpgroup), with
    e4m3 P's row sums (`_row_sums`) added to `l_i`: the output and the running sum once it is done."""
    p_op = _p_operand(p, v_smem.dtype, p_layout)
    acc_mma = warpgroup_mma(p_op, _values(v_smem, stage), acc, is_async=True)
    if _is_fp8(v_smem.dtype):
        sums_mma = _row_sums(ones, p_op)
        if HAND_OVER:
            hand_over(their_turn)
        acc, sums = warpgroup_mma_wait(num_outstanding=0, deps=[acc_mma, sums_mma])
        l_i += _row_sums_done(sums, rows_layout)
    else:
        if HAND_OVER:
            hand_over(their_turn)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc_mma])
    return acc, l_i


@gluon.jit
def _store_rows(acc, m_i, l_i, v_scale, q_nope_smem, kn_smem, q_free, OUT, LSE, q_start, q_len, m0, head, q_buffer, k_stage,
                stride_o_tok, stride_o_head, stride_lse_tok, HALF: gl.constexpr, V_DIM: gl.constexpr,
                MERGE: gl.constexpr, STAGING: gl.constexpr, GIVE_Q_BACK: gl.constexpr):
    """The warpgroup's rows normalized (and scaled by `v_scale`) and stored with their lse (merged into the
    earlier result with MERGE).
    Where Q is wide enough for them the rows go out as 16-byte row pieces (the accumulator's layout would write
    4-byte ones, half a sector at a time) through STAGING: the warpgroup's half of Q buffer `q_buffer`, which
    only its own MMAs read, or (STAGE_IN_K) the first rows of K stage `k_stage`, which the other warpgroup no
    longer reads (`_attend_rows`) and which goes back to the producer once they are read from it. With
    GIVE_Q_BACK, Q goes back (`q_free`) once the rows no longer need it."""
    o_layout: gl.constexpr = _accumulator_layout(V_DIM, q_nope_smem.dtype)
    row0 = m0 + HALF * WARPGROUP_ROWS
    lse, inv_l = finish_rows(m_i, l_i)
    inv_l = inv_l * v_scale
    out_rows = row0 + gl.arange(0, WARPGROUP_ROWS, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, V_DIM, layout=gl.SliceLayout(0, o_layout))
    row_ok = out_rows < q_len
    out = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
    lse = gl.convert_layout(lse, gl.SliceLayout(1, o_layout))
    token = (q_start + out_rows).to(gl.int64)
    out_ptrs = OUT + token[:, None] * stride_o_tok + head * stride_o_head + cols[None, :]
    lse_ptrs = LSE + token * stride_lse_tok + head
    if MERGE:
        earlier_lse = gl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        earlier_out = gl.load(out_ptrs, mask=row_ok[:, None], other=0.0).to(gl.float32)
        out, lse = merged_with_earlier(earlier_out, earlier_lse, out, lse)
    gl.store(lse_ptrs, lse, mask=row_ok)
    out_dtype: gl.constexpr = OUT.dtype.element_ty
    gl.static_assert(STAGING != STAGE_IN_K or (V_DIM <= q_nope_smem.shape[2] and out_dtype == q_nope_smem.dtype),
                     "STAGE_IN_K: the rows must fit the K stage, which only the staged path gives back")
    if STAGING != NO_STAGING and V_DIM <= q_nope_smem.shape[2] and out_dtype == q_nope_smem.dtype:
        pieces: gl.constexpr = row_piece_layout(V_DIM)
        if STAGING == STAGE_IN_Q:
            staging = q_nope_smem.index(q_buffer * 2 + HALF).slice(0, V_DIM, dim=1)
        else:
            staging = kn_smem.index(k_stage).slice(0, WARPGROUP_ROWS, dim=0).slice(0, V_DIM, dim=1)
        values = staged_in_row_pieces(staging, out.to(out_dtype))
        if GIVE_Q_BACK:
            _give_q_back(q_free)
        if STAGING == STAGE_IN_K:
            fence_async_shared()
            thread_barrier()
            _release_stage(k_stage, K_RING)
        piece_rows = row0 + gl.arange(0, WARPGROUP_ROWS, layout=gl.SliceLayout(1, pieces))
        piece_cols = gl.arange(0, V_DIM, layout=gl.SliceLayout(0, pieces))
        piece_tokens = (q_start + piece_rows).to(gl.int64)
        gl.store(OUT + piece_tokens[:, None] * stride_o_tok + head * stride_o_head + piece_cols[None, :], values,
                 mask=(piece_rows < q_len)[:, None])
    else:
        if GIVE_Q_BACK:
            _give_q_back(q_free)
        gl.store(out_ptrs, out.to(out_dtype), mask=row_ok[:, None])


@gluon.jit
def _give_q_back(q_free):
    """The persistent form's consumer warpgroup is done with Q (its MMAs and reads): one of `q_free`'s two
    arrivals, after every thread's reads and a proxy fence (the next Q arrives by TMA)."""
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(q_free, count=1)


@gluon.jit
def _program_tiles(m0, q_len, k_len, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """The key tiles rows m0 .. m0 + 128 see (0 where they see none)."""
    if CAUSAL:
        hi = gl.minimum(k_len, m0 + 2 * WARPGROUP_ROWS + k_len - q_len)
    else:
        hi = k_len
    return gl.cdiv(gl.maximum(hi, 0), BLOCK_N)


@gluon.jit
def _shared_buffers(dtype: gl.constexpr, NOPE_DIM: gl.constexpr, ROPE_DIM: gl.constexpr, V_DIM: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, Q_BUFFERS: gl.constexpr):
    """Q_BUFFERS Q buffers (two warpgroup halves each: buffer b's half h is index 2 b + h), the rings of key tiles
    and their barriers (initialized): q_ready per Q buffer (one arrival, the producer's expect), k_ready and v_ready
    (likewise) per stage of the K and V rings (stages go back to the producer through named barriers:
    `_release_stage`)."""
    gl.static_assert(STAGES <= RING_BARRIERS, "at most RING_BARRIERS stages a ring (one release barrier each)")
    q_nope_smem = gl.allocate_shared_memory(dtype, [2 * Q_BUFFERS, WARPGROUP_ROWS, NOPE_DIM],
                                            gl.NVMMASharedLayout.get_default_for([WARPGROUP_ROWS, NOPE_DIM], dtype))
    q_pe_smem = gl.allocate_shared_memory(dtype, [2 * Q_BUFFERS, WARPGROUP_ROWS, ROPE_DIM],
                                          gl.NVMMASharedLayout.get_default_for([WARPGROUP_ROWS, ROPE_DIM], dtype))
    kn_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, NOPE_DIM],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, NOPE_DIM], dtype))
    kpe_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, ROPE_DIM],
                                         gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], dtype))
    if _is_fp8(dtype):
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, V_DIM, BLOCK_N],
                                           gl.NVMMASharedLayout.get_default_for([V_DIM, BLOCK_N], dtype))
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, V_DIM],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, V_DIM], dtype))
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for buffer in gl.static_range(Q_BUFFERS):
        mbarrier.init(q_ready.index(buffer), count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(st), count=1)
        mbarrier.init(v_ready.index(st), count=1)
    return q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, q_ready, k_ready, v_ready


@gluon.jit
def _ones_operand(dtype: gl.constexpr, BLOCK_N: gl.constexpr, stand_in):
    """For e4m3 operands, SUM_COLUMNS x BLOCK_N ones in shared memory (K-major, as wgmma reads 8-bit B), which both
    consumer warpgroups only read: P times it sums each row of P on the tensor cores (`_row_sums`); 16-bit kernels
    read none and get `stand_in` back."""
    if _is_fp8(dtype):
        ones = gl.allocate_shared_memory(dtype, [SUM_COLUMNS, BLOCK_N],
                                         gl.NVMMASharedLayout.get_default_for([SUM_COLUMNS, BLOCK_N], dtype))
        # e4m3 1.0 as its bit pattern: converted from float32 ptxas packs the broadcast pair into half of each word
        # (F2FP ... MERGE_C with an unrelated register), leaving every other pair of bytes zero (NOTES.md, p32).
        ones.store(gl.full([SUM_COLUMNS, BLOCK_N], E4M3_ONE, gl.int8, layout=ZERO_T_LAYOUT).to(dtype, bitcast=True))
        return ones
    else:
        return stand_in


@gluon.jit
def _row_sums(ones, p_operand):
    """Each row's sum of the e4m3 P in `p_operand` (the P V operand), as P times `ones` (`_ones_operand`), issued
    async; `_row_sums_done` reads it once its wait is done."""
    sums_layout: gl.constexpr = _accumulator_layout(SUM_COLUMNS, ones.dtype)
    operand_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=sums_layout, k_width=4)
    zero = gl.zeros([WARPGROUP_ROWS, SUM_COLUMNS], gl.float32, layout=sums_layout)
    return warpgroup_mma(gl.convert_layout(p_operand, operand_layout, assert_trivial=True), ones.permute((1, 0)),
                         zero, use_acc=False, is_async=True)


@gluon.jit
def _row_sums_done(sums, rows_layout: gl.constexpr):
    """`_row_sums`' result (every column holds its row's sum) as one value a row in `rows_layout`."""
    return gl.convert_layout(gl.max(sums, 1), rows_layout)


@gluon.jit
def mha_prefill_hopper_kernel(
    Q_DESC, QPE_DESC, KN_DESC, KPE_DESC, V_DESC, OUT, LSE, CU_SEQLENS_Q, CU_SEQLENS_K, SCALES, KEY_STARTS,
    scale_log2, stride_q_head, stride_kn_head, stride_v_head, stride_o_tok, stride_o_head, stride_lse_tok,
    NOPE_DIM: gl.constexpr, ROPE_DIM: gl.constexpr, V_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MERGE: gl.constexpr,
):
    """Grid (row blocks of the longest segment, heads, segments), heaviest row blocks first; launched
    with 4 warps (the first consumer) plus a 4-warp consumer and a 1-warp producer."""
    block, head, q_start, q_len, k_start, k_len = program_segment(CU_SEQLENS_Q, CU_SEQLENS_K)
    if _is_fp8(Q_DESC.block_type.element_ty):
        k_start = gl.load(KEY_STARTS + gl.program_id(2))
    m0 = block * 2 * WARPGROUP_ROWS
    if m0 >= q_len or (MERGE and k_len == 0):
        return
    num_tiles = _program_tiles(m0, q_len, k_len, BLOCK_N, CAUSAL)
    q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, q_ready, k_ready, v_ready = _shared_buffers(
        Q_DESC.block_type.element_ty, NOPE_DIM, ROPE_DIM, V_DIM, BLOCK_N, STAGES, 1)
    ones = _ones_operand(Q_DESC.block_type.element_ty, BLOCK_N, v_smem)
    fence_async_shared()
    thread_barrier()

    gl.warp_specialize([
        (_consumer, (q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready, k_ready, v_ready,
                     OUT, LSE, SCALES, q_start, q_len, k_len, m0, head, num_tiles, scale_log2,
                     stride_o_tok, stride_o_head, stride_lse_tok, 0, V_DIM, BLOCK_N, STAGES, CAUSAL, MERGE)),
        (_consumer, (q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready, k_ready, v_ready,
                     OUT, LSE, SCALES, q_start, q_len, k_len, m0, head, num_tiles, scale_log2,
                     stride_o_tok, stride_o_head, stride_lse_tok, 1, V_DIM, BLOCK_N, STAGES, CAUSAL, MERGE)),
        (_producer, (q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, q_ready, k_ready, v_ready,
                     Q_DESC, QPE_DESC, KN_DESC, KPE_DESC, V_DESC, q_start + m0, head * stride_q_head,
                     k_start, head * stride_kn_head, head * stride_v_head, num_tiles,
                     NOPE_DIM, V_DIM, BLOCK_N, STAGES)),
    ], [4, 1], [232, 40])


@gluon.jit
def _unit(unit, CU_SEQLENS_Q, CU_SEQLENS_K, KEY_STARTS, row_blocks, heads, head_group, BLOCK_N: gl.constexpr,
          CAUSAL: gl.constexpr, MERGE: gl.constexpr):
    """Work unit `unit` (below the unit count) and whether it runs: row block, head, the segment's query and
    key ranges, its first row and key tile count. Units run segment by segment, within a segment group by
    group of `head_group` heads (their keys stay in L2), within a group heaviest row block first, then head:
    taken in this order, the heaviest go first and the light ones fill in where programs finish early."""
    per_segment = row_blocks * heads
    seq = unit // per_segment
    rest = unit % per_segment
    group = rest // (row_blocks * head_group)
    within = rest % (row_blocks * head_group)
    group_heads = gl.minimum(head_group, heads - group * head_group)
    block = row_blocks - 1 - within // group_heads
    head = group * head_group + within % group_heads
    q_start = gl.load(CU_SEQLENS_Q + seq)
    k_first = gl.load(CU_SEQLENS_K + seq)
    q_len = gl.load(CU_SEQLENS_Q + seq + 1) - q_start
    k_len = gl.load(CU_SEQLENS_K + seq + 1) - k_first
    k_start = k_first if KEY_STARTS is None else gl.load(KEY_STARTS + seq)
    m0 = block * 2 * WARPGROUP_ROWS
    runs = m0 < q_len
    if MERGE:
        runs = runs & (k_len > 0)
    return runs, head, q_start, q_len, k_start, k_len, m0, _program_tiles(m0, q_len, k_len, BLOCK_N, CAUSAL)


@gluon.jit
def _publish_unit(unit_smem, unit_ready, unit_free, work, published):
    """The producer hands the consumers its `published`-th running unit through the two-slot ring `unit_smem`:
    `work` = (unit, head, q_start, q_len, k_len, m0, num_tiles) as `_unit` gives them (unit = the unit count:
    stop), so the consumers need no global loads of their own; the slot once both consumers read what it held
    two units before (`unit_free`), the fields stored, then `unit_ready` (its release orders the warp's stores
    before the consumers' reads)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    slot = published % 2
    if published >= 2:
        mbarrier.wait(unit_free.index(slot), (published // 2 - 1) & 1)
    for field in gl.static_range(UNIT_FIELDS):
        unit_smem.index(slot * UNIT_FIELDS + field).store(gl.full([1], work[field], gl.int32, layout))
    thread_barrier()
    mbarrier.arrive(unit_ready.index(slot), count=1)


@gluon.jit
def _read_unit(unit_smem, unit_ready, unit_free, published):
    """A consumer warpgroup's read of the producer's `published`-th unit (`_publish_unit`): its fields, the slot
    given back (one of `unit_free`'s two arrivals) once every thread of the warpgroup holds them."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    slot = published % 2
    mbarrier.wait(unit_ready.index(slot), (published // 2) & 1)
    work = ()
    for field in gl.static_range(UNIT_FIELDS):
        work = work + (gl.max(unit_smem.index(slot * UNIT_FIELDS + field).load(layout), axis=0),)
    thread_barrier()
    mbarrier.arrive(unit_free.index(slot), count=1)
    return work


@gluon.jit
def _persistent_consumer(q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready, q_free, k_ready, v_ready, k_read,
                         unit_smem, unit_ready, unit_free, OUT, LSE, SCALES, num_units, scale_log2, stride_o_tok,
                         stride_o_head, stride_lse_tok,
                         HALF: gl.constexpr, V_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                         CAUSAL: gl.constexpr, MERGE: gl.constexpr, Q_BUFFERS: gl.constexpr):
    """`_consumer` over the units the producer publishes (every one runs) until it publishes the unit count:
    the i-th unit's Q is in buffer i % Q_BUFFERS, which goes back (its q_free) once the unit's rows have passed
    through it on their way out (`_store_rows`). With one Q buffer the second warpgroup's rows pass through the
    unit's last K stage instead and it gives Q back after its last S, so that the next unit's Q loads while its
    last P V and stores run (NOTES.md, p19).
    Between units the two warpgroups meet on the second turn barrier, so that the second one's first
    hand-over of a unit comes after the first one took its last of the unit before."""
    EARLY: gl.constexpr = (Q_BUFFERS == 1 and V_DIM <= q_nope_smem.shape[2] and BLOCK_N >= WARPGROUP_ROWS
                           and OUT.dtype.element_ty == q_nope_smem.dtype)
    keeps_last_k: gl.constexpr = EARLY and HALF == 1  # as `_attend_rows`: this warpgroup's rows pass through K
    scale_log2, v_scale = _operand_scales(SCALES, scale_log2, _is_fp8(q_nope_smem.dtype))
    first_tile = 0
    done = 0
    unit, head, q_start, q_len, k_len, m0, num_tiles = _read_unit(unit_smem, unit_ready, unit_free, done)
    while unit < num_units:
        q_buffer = done % Q_BUFFERS
        acc, m_i, l_i = _attend_rows(q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready.index(q_buffer),
                                     k_ready, v_ready, q_len, k_len, m0, num_tiles, first_tile,
                                     (done // Q_BUFFERS) & 1, q_buffer, scale_log2, q_free.index(q_buffer), k_read,
                                     HALF, V_DIM, BLOCK_N, STAGES, CAUSAL, EARLY)
        last_stage = (first_tile + num_tiles - 1) % STAGES
        if keeps_last_k:
            mbarrier.wait(k_read, done & 1)
        if keeps_last_k and num_tiles > 0:
            _store_rows(acc, m_i, l_i, v_scale, q_nope_smem, kn_smem, q_free.index(q_buffer), OUT, LSE, q_start, q_len, m0,
                        head, q_buffer, last_stage, stride_o_tok, stride_o_head, stride_lse_tok, HALF, V_DIM, MERGE,
                        STAGE_IN_K, False)
        else:  # a unit without tiles has no K stage to pass its rows through
            _store_rows(acc, m_i, l_i, v_scale, q_nope_smem, kn_smem, q_free.index(q_buffer), OUT, LSE, q_start, q_len, m0,
                        head, q_buffer, last_stage, stride_o_tok, stride_o_head, stride_lse_tok, HALF, V_DIM, MERGE,
                        NO_STAGING if keeps_last_k else STAGE_IN_Q, not keeps_last_k)
        if HALF == 0:
            hand_over(TURN_BARRIERS[1])
        else:
            take_over(TURN_BARRIERS[1])
        first_tile += num_tiles
        done += 1
        unit, head, q_start, q_len, k_len, m0, num_tiles = _read_unit(unit_smem, unit_ready, unit_free, done)


@gluon.jit
def _persistent_producer(q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, q_ready, q_free, k_ready, v_ready,
                         unit_smem, unit_ready, unit_free, Q_DESC, QPE_DESC, KN_DESC, KPE_DESC, V_DESC, CU_SEQLENS_Q,
                         CU_SEQLENS_K, KEY_STARTS, TAKEN, num_units, row_blocks, heads, head_group, stride_q_head, stride_kn_head,
                         stride_v_head, NOPE_DIM: gl.constexpr, V_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, CAUSAL: gl.constexpr, MERGE: gl.constexpr, Q_BUFFERS: gl.constexpr):
    """`_producer` over the units the program takes (`take_unit`, the next one once a unit's last tile is
    issued): each one that runs published to the consumers (`_publish_unit`), its Q loaded into buffer
    published % Q_BUFFERS once both consumers released that buffer's last unit, its tiles into the rings after
    the last unit's (the running tile count keeps stages and phases); units that do not run are neither
    published nor loaded. The unit count ends it."""
    first_tile = 0
    published = 0
    unit = gl.program_id(0)
    while unit < num_units:
        runs, head, q_start, q_len, k_start, k_len, m0, num_tiles = _unit(
            unit, CU_SEQLENS_Q, CU_SEQLENS_K, KEY_STARTS if _is_fp8(Q_DESC.block_type.element_ty) else None, row_blocks,
            heads, head_group, BLOCK_N, CAUSAL, MERGE)
        if runs:
            work = (unit, head, q_start, q_len, k_len, m0, num_tiles)
            _publish_unit(unit_smem, unit_ready, unit_free, work, published)
            q_buffer = published % Q_BUFFERS
            if published >= Q_BUFFERS:
                mbarrier.wait(q_free.index(q_buffer), (published // Q_BUFFERS - 1) & 1)
            _load_q(q_nope_smem, q_pe_smem, q_ready.index(q_buffer), Q_DESC, QPE_DESC, q_start + m0,
                    head * stride_q_head, q_buffer, NOPE_DIM)
            _load_tiles(kn_smem, kpe_smem, v_smem, k_ready, v_ready, KN_DESC, KPE_DESC, V_DESC, k_start,
                        head * stride_kn_head, head * stride_v_head, first_tile, num_tiles, NOPE_DIM, V_DIM, BLOCK_N,
                        STAGES)
            first_tile += num_tiles
            published += 1
        unit = take_unit(TAKEN, num_units, gl.num_programs(0))
    _publish_unit(unit_smem, unit_ready, unit_free, (num_units, 0, 0, 0, 0, 0, 0), published)
    _drain_stages(first_tile, STAGES)


@gluon.jit(do_not_specialize=("num_units", "row_blocks", "heads", "head_group"))
def mha_prefill_hopper_persistent_kernel(
    Q_DESC, QPE_DESC, KN_DESC, KPE_DESC, V_DESC, OUT, LSE, CU_SEQLENS_Q, CU_SEQLENS_K, SCALES, KEY_STARTS,
    scale_log2, stride_q_head, stride_kn_head, stride_v_head, stride_o_tok, stride_o_head, stride_lse_tok,
    num_units, row_blocks, heads, head_group, TAKEN,
    NOPE_DIM: gl.constexpr, ROPE_DIM: gl.constexpr, V_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MERGE: gl.constexpr, Q_BUFFERS: gl.constexpr,
):
    """The persistent form of `mha_prefill_hopper_kernel`: grid (programs, 1, 1), each program looping over
    work units (row block, head, segment; `_unit`), program p's first unit p, every later one taken from the
    int32 counter TAKEN (zero before the launch, zero again after it: `take_unit`), so the producer loads a
    unit's Q and first tiles while the consumers store the last one's rows. Only the producer takes: it
    publishes each unit that runs, with its work, to the consumers through a two-slot shared ring
    (`unit_smem`, barriers `unit_ready`, one arrival, and `unit_free`, two). Each of the Q_BUFFERS Q buffers
    (two where shared memory allows: the next unit's Q then loads while the consumers compute this one) gets a
    `q_free` barrier (two arrivals)."""
    q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, q_ready, k_ready, v_ready = _shared_buffers(
        Q_DESC.block_type.element_ty, NOPE_DIM, ROPE_DIM, V_DIM, BLOCK_N, STAGES, Q_BUFFERS)
    ones = _ones_operand(Q_DESC.block_type.element_ty, BLOCK_N, v_smem)
    q_free = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    unit_smem = gl.allocate_shared_memory(gl.int32, [2 * UNIT_FIELDS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    unit_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    unit_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_read = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(k_read, count=1)
    for buffer in gl.static_range(Q_BUFFERS):
        mbarrier.init(q_free.index(buffer), count=2)
    for slot in gl.static_range(2):
        mbarrier.init(unit_ready.index(slot), count=1)
        mbarrier.init(unit_free.index(slot), count=2)
    fence_async_shared()
    thread_barrier()

    gl.warp_specialize([
        (_persistent_consumer, (q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready, q_free, k_ready, v_ready,
                                k_read, unit_smem, unit_ready, unit_free, OUT, LSE, SCALES, num_units, scale_log2,
                                stride_o_tok, stride_o_head, stride_lse_tok,
                                0, V_DIM, BLOCK_N, STAGES, CAUSAL, MERGE, Q_BUFFERS)),
        (_persistent_consumer, (q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, ones, q_ready, q_free, k_ready, v_ready,
                                k_read, unit_smem, unit_ready, unit_free, OUT, LSE, SCALES, num_units, scale_log2,
                                stride_o_tok, stride_o_head, stride_lse_tok,
                                1, V_DIM, BLOCK_N, STAGES, CAUSAL, MERGE, Q_BUFFERS)),
        (_persistent_producer, (q_nope_smem, q_pe_smem, kn_smem, kpe_smem, v_smem, q_ready, q_free, k_ready, v_ready,
                                unit_smem, unit_ready, unit_free, Q_DESC, QPE_DESC, KN_DESC, KPE_DESC, V_DESC,
                                CU_SEQLENS_Q, CU_SEQLENS_K, KEY_STARTS, TAKEN, num_units, row_blocks, heads, head_group,
                                stride_q_head, stride_kn_head, stride_v_head, NOPE_DIM, V_DIM, BLOCK_N, STAGES, CAUSAL,
                                MERGE, Q_BUFFERS)),
    ], [4, 1], [232, 40])


@dataclasses.dataclass(frozen=True)
class HopperPrefillLaunch:
    """What one attention pass's launch takes from its operands' layout (not their addresses): the
    launch key, grid, strides, constexprs and the TMA boxes of q, k_nope, k_pe and v. Made by
    `plan_launch`; calling it launches the pass on any tensors of that layout (a prepared prefill keeps
    one per pass)."""

    key: tuple
    grid: tuple[int, int, int]
    strides: tuple[int, ...]
    constants: Mapping[str, object]
    boxes: tuple[tuple[int, int], ...]
    # For the persistent kernel: its trailing arguments (units, row blocks, heads, head group) and `taken`, its
    # int32 counter of units taken (zero between launches: the kernel sets it back). Launches of one such launch
    # object share the counter, so they must run one after another (on one stream), never concurrently with
    # each other (on two streams).
    schedule: tuple[int, ...] = ()
    taken: torch.Tensor | None = dataclasses.field(default=None, compare=False)

    @property
    def persistent(self) -> bool:
        """Whether this is the persistent kernel's launch (it holds a unit counter)."""
        return self.taken is not None

    def __call__(self, q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 scale_log2: float, scales: torch.Tensor | None = None, key_starts: torch.Tensor | None = None) -> None:
        """Runs the pass on tensors of the planned layout with at least one key row (TMA descriptors need rows);
        e4m3 operands take their float32 `scales` (q's times k's, v's) on the device and their segments' first key
        rows `key_starts` (int32, multiples of 16: TMA reads the transposed values from there; the lengths still
        come from `cu_seqlens_k`)."""
        self.launch_descriptors(q, *self.key_descriptors(head_rows(k_nope), head_rows(k_pe), value_matrix(v)),
                                cu_seqlens_q, cu_seqlens_k, out, lse, scale_log2, scales, key_starts)

    def key_descriptors(self, k_nope: Matrix, k_pe: Matrix,
                        v: Matrix) -> tuple[TensorDescriptor, TensorDescriptor, TensorDescriptor]:
        """The TMA descriptors of k_nope, k_pe and v given as the matrices `head_rows` makes of them (a caller
        whose keys stay at one address, such as a prepared prefill's held buffer, makes them once)."""
        kn_box, kpe_box, v_box = self.boxes[2:]
        return matrix_descriptor(k_nope, kn_box), matrix_descriptor(k_pe, kpe_box), matrix_descriptor(v, v_box)

    def launch_descriptors(self, q: torch.Tensor, k_nope: TensorDescriptor, k_pe: TensorDescriptor,
                           v: TensorDescriptor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, scale_log2: float,
                           scales: torch.Tensor | None = None, key_starts: torch.Tensor | None = None) -> None:
        """The call with k_nope, k_pe and v given as their `key_descriptors`."""
        fp8 = q.dtype == FP8_DTYPE
        if (scales is None) == fp8 or (key_starts is None) == fp8:
            raise MLAInputError(f"scales, key_starts: expected both exactly for e4m3 operands, got {q.dtype} with "
                                f"scales {scales is not None}, key_starts {key_starts is not None}")
        q_rows = head_rows(q)
        q_nope_box, q_pe_box = self.boxes[:2]
        # 16-bit operands read neither scales nor key starts: lse and cu_seqlens_k stand in for the pointers.
        arguments = (matrix_descriptor(q_rows, q_nope_box), matrix_descriptor(q_rows, q_pe_box), k_nope, k_pe, v, out,
                     lse, cu_seqlens_q, cu_seqlens_k, scales if fp8 else lse, key_starts if fp8 else cu_seqlens_k,
                     scale_log2, *self.strides)
        if self.persistent:
            _PERSISTENT(self.key, self.grid, (*arguments, *self.schedule, self.taken), self.constants)
        else:
            _PREFILL(self.key, self.grid, arguments, self.constants)


def plan_launch(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
                cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
                max_q_len: int, causal: bool, merge: bool, block_n: int, stages: int,
                persistent: bool = False) -> HopperPrefillLaunch:
    """The Hopper kernel's launch of one `triton_mha_prefill` pass for operands of these ones' layout
    (`supports` must hold); refuses a key tile or ring that does not fit. `persistent`: the persistent
    kernel's, one program per SM at most (`persistent_schedule`), with its own zeroed unit counter (a launch
    object must not run concurrently with itself: see `HopperPrefillLaunch`)."""
    nope_dim, rope_dim, v_dim = k_nope.shape[-1], k_pe.shape[-1], value_width(v)
    need = shared_bytes(nope_dim, rope_dim, v_dim, block_n, stages, q.element_size())
    if block_n not in (64, 128) or not 2 <= stages <= HOPPER_MAX_STAGES or need > SHARED_MEMORY_LIMIT:
        raise MLAInputError(f"block_n, stages: expected block_n 64 or 128 and 2 <= stages <= {HOPPER_MAX_STAGES} (a warpgroup "
                            f"releases a tile once it holds the next; a named barrier a stage) within "
                            f"{SHARED_MEMORY_LIMIT} bytes of shared memory, got block_n "
                            f"{block_n}, stages {stages}: {need} bytes")
    box_columns = TMA_BYTES // q.element_size()
    nope_chunk, v_chunk = min(box_columns, nope_dim), min(box_columns, v_dim)
    fp8 = q.dtype == FP8_DTYPE
    v_head = v_dim if fp8 else v.stride(1)  # where a head's values start: a row of V^T, or a column
    strides = (q.stride(1), k_nope.stride(1), v_head, out.stride(0), out.stride(1), lse.stride(0))
    key = (q.dtype, tuple((t.dtype, t.data_ptr() % 16) for t in (out, lse, cu_seqlens_q, cu_seqlens_k)), strides,
           nope_dim, rope_dim, v_dim, block_n, stages, causal, merge)
    constants = dict(NOPE_DIM=nope_dim, ROPE_DIM=rope_dim, V_DIM=v_dim, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                     MERGE=merge, num_warps=4)
    boxes = ((int(WARPGROUP_ROWS), nope_chunk), (int(WARPGROUP_ROWS), rope_dim), (block_n, nope_chunk),
             (block_n, rope_dim), (v_dim, block_n) if fp8 else (block_n, v_chunk))
    grid = (-(-max_q_len // BLOCK_M), q.shape[1], cu_seqlens_q.shape[0] - 1)
    if not persistent:
        return HopperPrefillLaunch(key, grid, strides, MappingProxyType(constants), boxes)
    programs, schedule = persistent_schedule(*grid, k_nope.shape[0] * (nope_dim + v_dim) * k_nope.element_size(),
                                             sm_count(q.device))
    taken = torch.zeros(1, dtype=torch.int32, device=q.device)
    constants["Q_BUFFERS"] = q_buffers(nope_dim, rope_dim, v_dim, block_n, stages, q.element_size())
    return HopperPrefillLaunch(key, (programs, 1, 1), strides, MappingProxyType(constants), boxes, schedule, taken)


def q_buffers(nope_dim: int, rope_dim: int, v_dim: int, block_n: int, stages: int, element_size: int = 2) -> int:
    """The persistent kernel's Q buffers: two where a second one fits the shared memory, else one.

    >>> q_buffers(128, 64, 128, 64, 3), q_buffers(128, 64, 128, 128, 2), q_buffers(128, 64, 128, 128, 2, 1)
    (2, 1, 2)
    """
    second = element_size * BLOCK_M * (nope_dim + rope_dim)
    fits = shared_bytes(nope_dim, rope_dim, v_dim, block_n, stages, element_size) + second <= SHARED_MEMORY_LIMIT
    return 2 if fits else 1


def persistent_schedule(row_blocks: int, heads: int, segments: int, head_key_bytes: int,
                        sms: int) -> tuple[int, tuple[int, int, int, int]]:
    """The persistent kernel's program count (one per SM, at most one per unit, at least one) and its
    schedule arguments: units (row block, head, segment), row blocks, heads and the heads whose keys
    (`head_key_bytes` each: K_nope and V of every key row) run together within L2_KEY_BYTES.

    >>> persistent_schedule(64, 128, 1, 8192 * 256 * 2, 132)  # DeepSeek's 128 heads, 8192 tokens
    (132, (8192, 64, 128, 8))
    >>> persistent_schedule(1, 3, 2, 10**9, 132), persistent_schedule(0, 3, 1, 0, 132)
    ((6, (6, 1, 3, 1)), (1, (0, 0, 3, 3)))
    """
    units = row_blocks * heads * segments
    head_group = max(1, min(heads, L2_KEY_BYTES // max(1, head_key_bytes)))
    return max(1, min(sms, units)), (units, row_blocks, heads, head_group)


def shared_bytes(nope_dim: int, rope_dim: int, v_dim: int, block_n: int, stages: int, element_size: int = 2) -> int:
    """Shared memory of one program: Q, the ring of key tiles, and 1 KiB for barriers and the compiler's scratch
    (operands of `element_size` bytes: 2, or 1 for e4m3).

    >>> shared_bytes(128, 64, 128, 128, 2), shared_bytes(128, 64, 128, 128, 3) > SHARED_MEMORY_LIMIT
    (214016, True)
    """
    ones = int(SUM_COLUMNS) * block_n if element_size == 1 else 0  # `_ones_operand`
    return element_size * (BLOCK_M * (nope_dim + rope_dim) + stages * block_n * (nope_dim + rope_dim + v_dim)) + ones + 1024


def head_rows(x: torch.Tensor) -> Matrix:
    """`x [tokens, heads, width]` (or `[tokens, width]`) as one matrix of token rows whose columns run
    over every head's span (head h at column h * stride(1)): address, dtype, shape and strides."""
    if x.dim() == 2:
        return x.data_ptr(), x.dtype, (x.shape[0], x.shape[1]), (x.stride(0), 1)
    columns = (x.shape[1] - 1) * x.stride(1) + x.shape[2]
    return x.data_ptr(), x.dtype, (x.shape[0], columns), (x.stride(0), 1)


_PREFILL = CachedLaunch(mha_prefill_hopper_kernel)
_PERSISTENT = CachedLaunch(mha_prefill_hopper_persistent_kernel)
