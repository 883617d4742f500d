"""Tile sizes, named-barrier numbers and register layouts of the Hopper decode kernels: the `gl.constexpr` values and
constexpr functions their bodies read."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from mlakit.kernels.hopper_common import BLOCK_N, wgmma_k
from mlakit.kernels.seesaw_layout import LATENT_CHUNK_COLUMNS

BLOCK_M = gl.constexpr(64)
NUM_WARPS = gl.constexpr(8)
STAGES = gl.constexpr(2)
TMA_CHUNK = gl.constexpr(LATENT_CHUNK_COLUMNS)
# Hardware named barriers for the seesaw's hand-offs between its two warpgroups (the compiler takes
# barriers 0-2 for its own synchronization in a two-partition kernel).
EVEN_MAX_READY = gl.constexpr(10)
ODD_MAX_READY = gl.constexpr(11)
EVEN_P_READY = gl.constexpr(12)
ROW_SUMS_READY = gl.constexpr(13)
RIGHT_VALUES_ISSUED = gl.constexpr(14)
# One warpgroup's rows in 16-byte pieces (query loads, zeroing the rows past a sequence's end).
WARPGROUP_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
# The seesaw's own merges (`dispatch.MERGE_MAX_SPLITS`): latent columns per step and partials whose loads are in
# flight together (128 x 2: a merge is a chain of dependent L2 round trips, half as many as with 64 x 4 for a
# sequence of two splits, as many for three or four; the ragged batch's programs spent 18-21 us in merges, NOTES.md
# v74).
MERGE_COLUMNS = gl.constexpr(128)
MERGE_SPLITS_PER_STEP = gl.constexpr(2)
MERGE_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0]))
# A program lets the combine launch past its last unit's tile loop only where that unit's sequence has at most
# this many splits: a combine let launch early behind many splits took 18-32% longer (NOTES.md v59, v60).
EARLY_TRIGGER_MAX_SPLITS = gl.constexpr(32)
# A warpgroup's share of 64 query columns (16-bit), 16 bytes per thread and row.
QUERY_BLOCK = gl.constexpr(gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0]))
# One warpgroup's words of an fp8 `[BLOCK_N, TMA_CHUNK]` box (16 per row), 16 bytes per thread and row.
FP8_BOX_WORDS = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0]))


@gluon.constexpr_function
def _score_layout(e4m3=False):
    """Register layout of one warpgroup's S tile `[BLOCK_M, BLOCK_N]` (a wgmma accumulator; of 8-bit operands
    where `e4m3`, whose instructions take 32 columns of K)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N.value, wgmma_k(e4m3)])


@gluon.constexpr_function
def _half_output_layout(kv_lora_rank):
    """Register layout of one warpgroup's half of the output `[BLOCK_M, kv_lora_rank / 2]`."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, kv_lora_rank // 2, 16])
