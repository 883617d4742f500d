"""Gluon helpers that more than one Hopper decode kernel calls: a row tile's query load, the split kernels' shared
memory, the scores' masking, per-row vectors and the output's column stores."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from mlakit.kernels.gluon_compat import cp_async_load
from mlakit.kernels.hopper_common import BLOCK_N, store_output
from mlakit.kernels.hopper_decode.constants import BLOCK_M, STAGES


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
    cp_async_load(q_lat_smem, Q + q_base[:, None] + lat_cols[None, :], mask=q_row_ok[:, None])
    cp_async_load(q_rope_smem, Q + q_base[:, None] + rank + rope_cols[None, :], mask=q_row_ok[:, None])


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
def _store_columns(out, col0, OUT, PART_OUT, first_token, b, split, num_splits, tile, q_len,
                   OUT_STRIDES, PART_STRIDES,
                   HEADS: gl.constexpr, LAYOUT: gl.constexpr):
    """Output columns col0 .. col0 + width of the tile (`store_output`)."""
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LAYOUT))
    cols = col0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, LAYOUT))
    store_output(out, rows[:, None], cols[None, :], OUT, PART_OUT, first_token, b, split, num_splits, q_len,
                  OUT_STRIDES, PART_STRIDES, HEADS)
