"""Pieces shared by the Hopper (SM90) Gluon decode kernels (`hopper_decode`, `hopper_narrow_decode`):
which devices and caches they serve, a program's place in the split plan, the online softmax's
bookkeeping, and the stores of outputs and lse to the output or a split's partial."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable
from typing import TypeVar

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mlakit.kernels.decode_split_plan import WORK_FIELDS
from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.kernels.gluon_compat import thread_barrier
from mlakit.kernels.seesaw_layout import KV_TILE_TOKENS

BLOCK_N = gl.constexpr(KV_TILE_TOKENS)
# float32's smallest normal value (`online_softmax`'s floor for a score scale).
SMALLEST_NORMAL = gl.constexpr(1.1754943508222875e-38)
KV_LORA_RANKS = frozenset({64, 128, 256, 512})
ROPE_DIMS = frozenset({16, 32, 64})
LN2 = gl.constexpr(0.6931471805599453)


@gluon.constexpr_function
def wgmma_k(e4m3):
    """The reduction columns one wgmma instruction takes (an accumulator layout's instr_shape[2]): 32 of 8-bit
    operands (`e4m3`), 16 of 16-bit ones."""
    return 32 if e4m3 else 16

GLUON_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def serves(device: torch.device, kv_dtype: torch.dtype) -> bool:
    """Whether the Hopper kernel serves caches of `kv_dtype` on `device` (an SM90 GPU; bf16, fp16 or fp8)."""
    return device.type == "cuda" and kv_dtype in (*GLUON_DTYPES, FP8_DTYPE) and capability(device)[0] == 9


@functools.cache
def capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


# A matrix as a TMA descriptor reads it: address, dtype, shape and strides.
Matrix = tuple[int, torch.dtype, tuple[int, int], tuple[int, int]]

T = TypeVar("T")

# Descriptors kept in each memo (a model's layers x the descriptors of one call, with room to spare).
MAX_DESCRIPTORS = 1024
_DESCRIPTORS: dict[tuple, TensorDescriptor] = {}
_ROW_DESCRIPTORS: dict[tuple, tuple[TensorDescriptor, ...]] = {}


@dataclasses.dataclass(frozen=True)
class TensorAddress:
    """What a TMA descriptor needs of the tensor it reads: its address and dtype. Held in place of the
    tensor, so that a kept descriptor does not keep a freed cache's memory alive."""

    address: int
    dtype: torch.dtype

    def data_ptr(self) -> int:
        return self.address


def remember(memo: dict, key: Hashable, value: T) -> T:
    """`value` kept in a descriptor memo under `key` (the memo emptied first once it holds MAX_DESCRIPTORS)."""
    if len(memo) >= MAX_DESCRIPTORS:
        memo.clear()
    memo[key] = value
    return value


def row_descriptors(pages: torch.Tensor, boxes: tuple[tuple[int, int], ...]) -> tuple[TensorDescriptor, ...]:
    """TMA descriptors of the cache rows `[pages x page_size, dim]` (row-contiguous pages), one per box
    `(rows, columns)`: the rows read as `[rows, columns]` blocks (`matrix_descriptor`), kept as a tuple
    by the pages' address, shape, strides and dtype (one lookup a call)."""
    key = (pages.data_ptr(), pages.shape, pages.stride(), pages.dtype, boxes)
    found = _ROW_DESCRIPTORS.get(key)
    if found is None:
        rows = pages.reshape(-1, pages.shape[-1])
        matrix = (rows.data_ptr(), rows.dtype, tuple(rows.shape), tuple(rows.stride()))
        found = remember(_ROW_DESCRIPTORS, key, tuple(matrix_descriptor(matrix, box) for box in boxes))
    return found


def matrix_descriptor(matrix: Matrix, box: tuple[int, int]) -> TensorDescriptor:
    """The TMA descriptor of a matrix `(address, dtype, shape, strides)` read in `box = (rows, columns)` blocks.

    Kept by address, shape, strides, dtype and box, so a matrix at a new address (or of a new shape)
    gets a new descriptor and one at a reused address with the same shape gets the same one, which
    reads the same bytes: a kept descriptor is never stale and holds no reference to the tensor."""
    key = (*matrix, box)
    found = _DESCRIPTORS.get(key)
    if found is None:
        address, dtype, shape, strides = matrix
        found = remember(_DESCRIPTORS, key, TensorDescriptor(
            TensorAddress(address, dtype), list(shape), list(strides), list(box),
            gl.NVMMASharedLayout.get_default_for(list(box), _ELEMENTS[dtype])))
    return found


_ELEMENTS = {FP8_DTYPE: gl.float8e4nv, **GLUON_DTYPES}


@gluon.jit
def work_item(WORK, item):
    """Work item `item` of the plan: its sequence, split, the sequence's split count and query segment
    (rows without an item hold zeros: split 0 of 0, which no program takes). The sequence's
    cached length is loaded only by programs with work: one that finds none exits after this one load
    (NOTES.md v30)."""
    entry = WORK + item * WORK_FIELDS
    return gl.load(entry), gl.load(entry + 1), gl.load(entry + 2), gl.load(entry + 3), gl.load(entry + 4)


@gluon.jit
def split_range(WORK, item, seqlen):
    """Work item `item`'s KV tokens start .. end (the plan's, cut to the sequence's length) and its tile count
    (zero, never negative, for a split past the sequence's end: the barrier phases use it). The plan's ranges
    start on whole tiles; rounding the start down says so to the compiler (the seesaw spills less)."""
    entry = WORK + item * WORK_FIELDS
    start = gl.load(entry + 5) // BLOCK_N * BLOCK_N
    end = gl.minimum(seqlen, gl.load(entry + 6))
    return start, end, gl.maximum(gl.cdiv(end - start, BLOCK_N), 0)


@gluon.jit
def grid_work(WORK, ROWS: gl.constexpr, HEADS: gl.constexpr):
    """A grid program's unit (program ids: its tile of ROWS query rows, its plan row): the `work_item`, the row tile
    and whether the program is idle (a split past its sequence's count, or no query rows in its tile), in which case
    the kernel returns before loading anything else."""
    b, split, num_splits, first_token, q_len = work_item(WORK, gl.program_id(1))
    tile = gl.program_id(0)
    idle = (split >= num_splits) | (tile * ROWS >= q_len * HEADS)
    return b, split, num_splits, first_token, q_len, tile, idle


@gluon.jit
def no_keys_yet(ROWS: gl.constexpr, LAYOUT: gl.constexpr):
    """Running max (-inf) and sum (0) of ROWS rows before their first key, in layout LAYOUT."""
    return gl.full([ROWS], float("-inf"), gl.float32, layout=LAYOUT), gl.zeros([ROWS], gl.float32, layout=LAYOUT)


@gluon.jit
def online_softmax(s, m_i, AXIS: gl.constexpr = 1, scale=1.0):
    """P of one tile, the factor rescaling what came before, and the new running row max (rows'
    scores along AXIS of `s`: 1 for S, 0 for S^T). The scores are `s * scale` (scale > 0: the max
    is taken before scaling), the scaling folded into the exponent's argument (one FMA a score). A scale
    that underflowed to 0 is taken as float32's smallest normal (-inf * 0 would be NaN)."""
    scale = gl.maximum(scale, SMALLEST_NORMAL)
    m_new = gl.maximum(m_i, gl.max(s, AXIS) * scale)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    return gl.exp2(s * scale - gl.expand_dims(m_safe, AXIS)), gl.exp2(m_i - m_safe), m_new


@gluon.jit
def finish_rows(m_i, l_i):
    """Natural-log lse and the output scale 1 / l per row (-inf and 0 for rows that saw no key)."""
    has_keys = l_i > 0
    lse = gl.where(has_keys, (m_i + gl.log2(gl.where(has_keys, l_i, 1.0))) * LN2, float("-inf"))
    return lse, gl.where(has_keys, 1.0 / gl.where(has_keys, l_i, 1.0), 0.0)


@gluon.jit
def store_lse(lse, rows, LSE, PART_LSE, first_token, b, split, num_splits, q_len,
               LSE_STRIDES, PART_STRIDES, HEADS: gl.constexpr):
    """The tile's lse: to LSE when the sequence has one split, else to its split's partial."""
    row_ok = rows < q_len * HEADS
    if num_splits == 1:
        stride_lse_cu, stride_lse_b, stride_lse_i, stride_lse_h = LSE_STRIDES
        lse_ptr = (LSE + first_token * stride_lse_cu + b * stride_lse_b + (rows // HEADS) * stride_lse_i
                   + (rows % HEADS) * stride_lse_h)
        gl.store(lse_ptr, lse, mask=row_ok)
    else:
        gl.store(PART_LSE + b * PART_STRIDES[3] + split * PART_STRIDES[4] + rows, lse, mask=row_ok)


@gluon.jit
def store_output(out, rows, cols, OUT, PART_OUT, first_token, b, split, num_splits, q_len,
                  OUT_STRIDES, PART_STRIDES, HEADS: gl.constexpr):
    """`out` is query row `rows`, latent column `cols` (both broadcast to its shape): to OUT when the
    sequence has one split, else to its split's partial (converted to the partials' dtype); rows past the segment
    are skipped."""
    row_ok = rows < q_len * HEADS
    if num_splits == 1:
        base = (first_token + rows // HEADS).to(gl.int64) * OUT_STRIDES[0] + (rows % HEADS) * OUT_STRIDES[1]
        gl.store(OUT + base + cols, out.to(OUT.dtype.element_ty), mask=row_ok)
    else:
        part = PART_OUT + b * PART_STRIDES[0] + split * PART_STRIDES[1]
        gl.store(part + rows * PART_STRIDES[2] + cols, out.to(PART_OUT.dtype.element_ty), mask=row_ok)


@gluon.constexpr_function
def row_piece_layout(width):
    """Register layout of a warpgroup's `[rows, width]` 16-bit values in 16-byte pieces, a row's pieces on
    neighbouring lanes (whole 128-byte lines per warp store)."""
    lanes = min(32, width // 8)
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [4, 1], [1, 0])


@gluon.jit
def staged_in_row_pieces(staging, values):
    """A warpgroup's 16-bit `values [rows, width]` written to the shared-memory view `staging` (same shape; only
    this warpgroup may use it meanwhile) and read back in `row_piece_layout(width)`, for global stores in 16-byte
    row pieces (an MMA accumulator's layout would store 4-byte ones, half a sector at a time)."""
    staging.store(values)
    thread_barrier()
    return staging.load(row_piece_layout(values.shape[1]))


@gluon.jit
def zero_rows_from(smem, first_bad, CHUNK: gl.constexpr, LAYOUT: gl.constexpr):
    """Rows first_bad .. of `smem` set to zero, CHUNK columns at a time (TMA brings whole page rows:
    rows past a sequence's end may hold anything, NaN included)."""
    rows = gl.arange(0, smem.shape[0], layout=gl.SliceLayout(1, LAYOUT))
    for c in gl.static_range(smem.shape[1] // CHUNK):
        part = smem.slice(c * CHUNK, CHUNK, dim=1)
        values = part.load(LAYOUT)
        part.store(gl.where((rows < first_bad)[:, None], values, gl.zeros_like(values)))


# Query rows of 16-bit or 8-bit MMAs are scaled so that their largest magnitude lies in [2^EXPONENT, 2^(EXPONENT + 1)):
# fp16 holds < 2^16, e4m3 <= 448.
FP16_QUERY_EXPONENT = gl.constexpr(14)
E4M3_QUERY_EXPONENT = gl.constexpr(7)
# The factor's biased fp32 exponent stays within these (2^-113 .. 2^113: normal, and its inverse too).
MIN_FACTOR_EXPONENT = gl.constexpr(14)
MAX_FACTOR_EXPONENT = gl.constexpr(240)


@gluon.jit
def query_row_factor(amax, EXPONENT: gl.constexpr):
    """Per query row, the power of two that brings its largest magnitude `amax` into [2^EXPONENT, 2^(EXPONENT + 1))
    (`FP16_QUERY_EXPONENT` for MMAs in fp16: exact for bf16 values down to 2^-31 of the row's largest, smaller ones
    cannot move a score; `E4M3_QUERY_EXPONENT` for e4m3): 2^(EXPONENT - floor(log2 amax)) built from amax's exponent
    bits, kept inside fp32's normal range (all-zero rows get the largest)."""
    biased = (amax.to(gl.int32, bitcast=True) >> 23) & 0xFF
    factor_exponent = gl.minimum(gl.maximum(127 + EXPONENT + 127 - biased, MIN_FACTOR_EXPONENT), MAX_FACTOR_EXPONENT)
    return (factor_exponent << 23).to(gl.float32, bitcast=True)


@gluon.jit
def hand_over(BARRIER: gl.constexpr):
    """A warpgroup's side of a hand-off to the other one: its 128 threads arrive on the named BARRIER of
    both warpgroups (256 threads) after their shared-memory stores, and go on without waiting."""
    _named_barrier("arrive", BARRIER)


@gluon.jit
def take_over(BARRIER: gl.constexpr):
    """The receiving side: waits on the named BARRIER until the other warpgroup has arrived; its shared-memory
    stores before that are then visible."""
    _named_barrier("sync", BARRIER)


@gluon.jit
def launch_dependents():
    """`griddepcontrol.launch_dependents`: a programmatic dependent launch of this kernel may begin once every
    program has executed it (or exited); the dependent must wait (`griddepcontrol.wait`) before reading its results."""
    # Inline assembly needs an operand: the program id stands in.
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents;\n mov.u32 $0, 0;", "=r,r", [gl.program_id(0)],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def named_barrier_at(barrier, OP: gl.constexpr, THREADS: gl.constexpr):
    """`bar.OP` ("arrive" or "sync") on the named barrier whose id `barrier` is known at run time only, for
    THREADS threads in all (a multiple of 32)."""
    gl.inline_asm_elementwise(f"bar.{OP} $1, {THREADS};\n mov.u32 $0, 0;", "=r,r", [barrier], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _named_barrier(OP: gl.constexpr, BARRIER: gl.constexpr):
    # Inline assembly needs an operand: the program id stands in.
    gl.inline_asm_elementwise(f"bar.{OP} {BARRIER}, 256;\n mov.u32 $0, 0;", "=r,r", [gl.program_id(0)],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def take_unit(TAKEN, units, programs):
    """The unit a persistent program takes after finishing (or skipping) one: the next untaken one past the
    first round (units 0 .. programs - 1 go to programs 0 .. programs - 1), from the int32 counter TAKEN;
    `units` where every unit is taken. Every unit takes once when it is done, so the take that finds
    units - 1 taken is the last of the launch: it sets the counter back to zero for the next launch.
    Launches of one round take nothing."""
    if units > programs:
        taken = gl.atomic_add(TAKEN, 1)
        if taken == units - 1:
            gl.store(TAKEN, 0)
        unit = gl.minimum(programs + taken, units)
    else:
        unit = units
    return unit
