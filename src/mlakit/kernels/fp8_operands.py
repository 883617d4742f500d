"""Triton kernels that round the MHA-form prefill's operands to e4m3 with one scale a tensor, for
`mlakit.prefill.fp8.quantize_prefill_operands`, without a host sync. In float32, IEEE-rounded: the scale is
`largest / 448` (1 for an all-zero tensor), x's quotient is x times the scale's reciprocal (x / scale where the
scale is below float32's smallest normal, whose reciprocal would overflow), clamped to [-448, 448] and rounded
to the nearest e4m3 value, ties to even (`_e4m3`): within two float32 ulps of x / scale before e4m3's own
rounding, a division's cost saved on every element.

Three launches; each input is read twice:
- `_largest_kernel`: every program takes every num_programs-th tile of (token, head) rows of q, of k_nope, of
  k_pe and of v, and writes its largest magnitudes of q, k (k_nope and k_pe) and v to `partial [3, programs]`.
- `_plan_kernel`, one program: the three scales from those, and each key segment's first output row once every
  segment starts at a multiple of KEY_ALIGNMENT rows (the gaps between segments hold zeros).
- `_round_kernel`: the first programs each fill a block of output key rows for one head: a binary search of the
  segments' first rows finds each row's key (none in a gap), whose k_nope, v and (head 0) k_pe it rounds; the k
  rows go in place, the v block goes transposed into v_t (keys contiguous, each aligned group of keys in
  `value_columns`' order), and head 0 writes key_rows and value_columns. The other programs each round a block
  of q's (token, head) rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mlakit.cache.kv_quant import FP8_DTYPE, FP8_MAX
from mlakit.errors import MLAInputError
from mlakit.kernels.interpreter import INTERPRET
from mlakit.kernels.launch import CachedLaunch

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Key segments start this many rows apart in the outputs (v_t's keys are its inner dimension: TMA's 16-byte rule),
# and v_t holds each aligned group of this many keys in the order of `_value_row`'s inverse.
KEY_ALIGNMENT = 16
ALIGNMENT = tl.constexpr(KEY_ALIGNMENT)
E4M3_LIMIT = tl.constexpr(FP8_MAX)
SMALLEST_NORMAL = tl.constexpr(torch.finfo(torch.float32).tiny)


@dataclasses.dataclass(frozen=True)
class RoundingTiles:
    """Tile sizes (powers of two) and launch settings of the rounding kernels: elements of one tile of the
    largest-magnitude pass and its most programs, the output key rows and q's (token, head) rows a rounding
    program takes, the segments the plan takes at a time."""

    largest_elements: int = 8192
    largest_programs: int = 2048
    key_rows: int = 32
    query_rows: int = 16
    segments: int = 256
    num_warps: int = 4

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 1 or (field.name != "largest_programs" and value & (value - 1)):
                raise MLAInputError(f"RoundingTiles.{field.name}: expected a power of two (largest_programs: any "
                                    f"integer >= 1), got {value!r}")


DEFAULT_TILES = RoundingTiles()
INTERPRETER_TILES = RoundingTiles(largest_elements=256, largest_programs=3, key_rows=32, query_rows=4, segments=2,
                                  num_warps=1)


class E4m3Operands(NamedTuple):
    """`round_operands`' tensors, named as `Fp8PrefillOperands`' fields."""

    q: torch.Tensor
    k_nope: torch.Tensor
    k_pe: torch.Tensor
    v_t: torch.Tensor
    scales: torch.Tensor
    key_starts: torch.Tensor
    key_rows: torch.Tensor
    value_columns: torch.Tensor


@triton.jit
def _float32(x):
    """x in float32, exactly (the interpreter's bf16 cast garbles subnormals)."""
    if INTERPRET:
        if x.dtype == tl.bfloat16:
            return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _e4m3_bits(x):
    """The e4m3 code of float32 x (|x| <= 448, or NaN) to nearest, ties to even, as c10's fp8e4m3fn_from_fp32_value."""
    bits = x.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # Below e4m3's smallest normal, 2^-6: adding 2^14, whose float32 ulp is e4m3's 2^-9, rounds.
    subnormal = (tl.abs(x) + 16384.0).to(tl.int32, bitcast=True) - 0x46800000
    normal = (magnitude - 0x3C000000 + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20
    code = tl.where(magnitude < 0x3C800000, subnormal, normal)
    code = tl.where(x != x, 0x7F, code)  # NaN stays NaN
    return (code | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def _quotient(x, scale):
    """float32 x / scale as the module docstring says: x times the scale's reciprocal where that is finite."""
    if scale >= SMALLEST_NORMAL:
        quotient = x * tl.div_rn(1.0, scale)
    else:
        quotient = tl.div_rn(x, scale)
    return quotient


@triton.jit
def _e4m3(x, scale):
    """x / scale in e4m3 (module docstring)."""
    quotient = _quotient(_float32(x), scale)
    clamped = tl.minimum(tl.maximum(quotient, -E4M3_LIMIT, propagate_nan=tl.PropagateNan.ALL), E4M3_LIMIT,
                         propagate_nan=tl.PropagateNan.ALL)
    if INTERPRET:  # the interpreter's fp8 cast rounds ties away from zero and can drop a carry
        return _e4m3_bits(clamped).to(tl.float8e4nv, bitcast=True)
    return clamped.to(tl.float8e4nv)


@triton.jit
def _row_offsets(n, stride_token, stride_head, HEADS: tl.constexpr):
    """int64 offsets of rows n = token * HEADS + head of a [tokens, HEADS, width] view."""
    n = n.to(tl.int64)
    return n // HEADS * stride_token + n % HEADS * stride_head


@triton.jit
def _largest(X, count, stride_token, stride_head, HEADS: tl.constexpr, WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr,
             BLOCK: tl.constexpr):
    """The largest magnitude in this program's tiles (every num_programs-th, of BLOCK rows) of the `count`
    (token, head) rows of a [tokens, HEADS, WIDTH] view."""
    cols = tl.arange(0, WIDTH_P2)
    largest = tl.zeros([BLOCK, WIDTH_P2], tl.float32)
    for tile in range(tl.program_id(0), tl.cdiv(count, BLOCK), tl.num_programs(0)):
        n = tile * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + _row_offsets(n, stride_token, stride_head, HEADS)[:, None] + cols[None, :],
                    mask=(n < count)[:, None] & (cols < WIDTH)[None, :], other=0.0)
        largest = tl.maximum(largest, tl.abs(_float32(x)))
    return tl.max(tl.max(largest, 1), 0)


@triton.jit(do_not_specialize=["queries", "keys"])
def _largest_kernel(
    Q, K_NOPE, K_PE, V, PARTIAL, queries, keys,
    stride_q_token, stride_q_head, stride_kn_token, stride_kn_head, stride_kp_token, stride_v_token, stride_v_head,
    HEADS: tl.constexpr, QK: tl.constexpr, QK_P2: tl.constexpr, NOPE: tl.constexpr, NOPE_P2: tl.constexpr,
    ROPE: tl.constexpr, ROPE_P2: tl.constexpr, V_DIM: tl.constexpr, V_DIM_P2: tl.constexpr,
    BLOCK_QK: tl.constexpr, BLOCK_NOPE: tl.constexpr, BLOCK_ROPE: tl.constexpr, BLOCK_V_DIM: tl.constexpr,
):
    q = _largest(Q, queries * HEADS, stride_q_token, stride_q_head, HEADS, QK, QK_P2, BLOCK_QK)
    k = tl.maximum(_largest(K_NOPE, keys * HEADS, stride_kn_token, stride_kn_head, HEADS, NOPE, NOPE_P2, BLOCK_NOPE),
                   _largest(K_PE, keys, stride_kp_token, 0, 1, ROPE, ROPE_P2, BLOCK_ROPE))
    v = _largest(V, keys * HEADS, stride_v_token, stride_v_head, HEADS, V_DIM, V_DIM_P2, BLOCK_V_DIM)
    program, programs = tl.program_id(0), tl.num_programs(0)
    tl.store(PARTIAL + program, q)
    tl.store(PARTIAL + programs + program, k)
    tl.store(PARTIAL + 2 * programs + program, v)


@triton.jit
def _scale(PARTIAL, programs, PROGRAMS_P2: tl.constexpr):
    """The float32 scale that maps the largest of the `programs` partial maxima to e4m3's largest value (1 for an
    all-zero tensor)."""
    i = tl.arange(0, PROGRAMS_P2)
    largest = tl.max(tl.load(PARTIAL + i, mask=i < programs, other=0.0), 0)
    return tl.where(largest > 0, tl.div_rn(largest, E4M3_LIMIT), 1.0)


@triton.jit
def _write_key_starts(CU_SEQLENS, KEY_STARTS, segments, BLOCK: tl.constexpr):
    """KEY_STARTS[b]: segment b's first row when every segment starts at a multiple of KEY_ALIGNMENT rows (b =
    segments: where the keys past the last segment go)."""
    tl.store(KEY_STARTS, 0)
    end = tl.zeros([], tl.int32)
    for first in range(0, segments, BLOCK):
        b = first + tl.arange(0, BLOCK)
        ok = b < segments
        lengths = (tl.load(CU_SEQLENS + b + 1, mask=ok, other=0) - tl.load(CU_SEQLENS + b, mask=ok, other=0))
        padded = ((lengths + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT).to(tl.int32)
        tl.store(KEY_STARTS + b + 1, end + tl.cumsum(padded, 0), mask=ok)
        end += tl.sum(padded, 0)


@triton.jit(do_not_specialize=["programs", "segments"])
def _plan_kernel(
    PARTIAL, CU_SEQLENS, TENSOR_SCALES, SCALES, KEY_STARTS, programs, segments,
    PROGRAMS_P2: tl.constexpr, BLOCK_SEGMENTS: tl.constexpr,
):
    q_scale = _scale(PARTIAL, programs, PROGRAMS_P2)
    k_scale = _scale(PARTIAL + programs, programs, PROGRAMS_P2)
    v_scale = _scale(PARTIAL + 2 * programs, programs, PROGRAMS_P2)
    tl.store(TENSOR_SCALES, q_scale)
    tl.store(TENSOR_SCALES + 1, k_scale)
    tl.store(TENSOR_SCALES + 2, v_scale)
    tl.store(SCALES, q_scale * k_scale)
    tl.store(SCALES + 1, v_scale)
    _write_key_starts(CU_SEQLENS, KEY_STARTS, segments, BLOCK_SEGMENTS)


@triton.jit
def _row_keys(row, CU_SEQLENS, KEY_STARTS, keys, segments, search_steps):
    """The caller's key whose values go to output `row`, and whether there is one (none in a gap): the key's
    segment is the last one starting at or before `row` (a binary search of KEY_STARTS)."""
    segment = tl.zeros_like(row)
    end = segment + segments + 1
    for _ in range(search_steps):
        middle = (segment + end) // 2
        before = tl.load(KEY_STARTS + middle) <= row
        segment = tl.where(before, middle, segment)
        end = tl.where(before, end, middle)
    key = tl.load(CU_SEQLENS + segment) + row - tl.load(KEY_STARTS + segment)
    last = tl.load(CU_SEQLENS + segment + 1, mask=segment < segments, other=keys)
    return key, key < tl.minimum(last, keys)


@triton.jit
def _value_row(column):
    """The key row whose values v_t's `column` holds: within each group, column 4a + 2b + c holds key 8b + 2a + c
    (`value_columns` inverted)."""
    low = column % ALIGNMENT
    return column - low + 8 * ((low >> 1) & 1) + 2 * (low >> 2) + (low & 1)


@triton.jit
def _rounded_rows(X, key, valid, stride_key, scale, WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr):
    """Rows `key` of a [keys, WIDTH] view in e4m3 (zeros where not `valid`), [len(key), WIDTH_P2]."""
    cols = tl.arange(0, WIDTH_P2)
    x = tl.load(X + key.to(tl.int64)[:, None] * stride_key + cols[None, :],
                mask=valid[:, None] & (cols < WIDTH)[None, :], other=0.0)
    return _e4m3(x, scale)


@triton.jit
def _store_rows(Y, row, ok, values, row_stride: tl.constexpr, WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr):
    """values [len(row), WIDTH_P2] into rows `row` (where `ok`) of Y, WIDTH columns each."""
    cols = tl.arange(0, WIDTH_P2)
    tl.store(Y + row.to(tl.int64)[:, None] * row_stride + cols[None, :], values,
             mask=ok[:, None] & (cols < WIDTH)[None, :])


@triton.jit
def _round_keys(
    program, K_NOPE, K_PE, V, k_scale, v_scale, CU_SEQLENS, KEY_STARTS, K_NOPE8, K_PE8, V_T,
    KEY_ROWS, VALUE_COLUMNS,
    keys, rows, segments, search_steps, stride_kn_token, stride_kn_head, stride_kp_token, stride_v_token, stride_v_head,
    HEADS: tl.constexpr, NOPE: tl.constexpr, NOPE_P2: tl.constexpr, ROPE: tl.constexpr, ROPE_P2: tl.constexpr,
    V_DIM: tl.constexpr, V_DIM_P2: tl.constexpr, BLOCK: tl.constexpr,
):
    """Output key rows (v_t columns) `program // HEADS * BLOCK` on, of head `program % HEADS` (module docstring)."""
    head = program % HEADS
    column = program // HEADS * BLOCK + tl.arange(0, BLOCK)
    row = _value_row(column)
    key, valid = _row_keys(row, CU_SEQLENS, KEY_STARTS, keys, segments, search_steps)
    in_rows = column < rows
    k_nope = _rounded_rows(K_NOPE + head * stride_kn_head, key, valid, stride_kn_token, k_scale, NOPE, NOPE_P2)
    _store_rows(K_NOPE8 + head * NOPE, row, in_rows, k_nope, HEADS * NOPE, NOPE, NOPE_P2)
    v = _rounded_rows(V + head * stride_v_head, key, valid, stride_v_token, v_scale, V_DIM, V_DIM_P2)
    dims = tl.arange(0, V_DIM_P2)
    tl.store(V_T + (head * V_DIM + dims).to(tl.int64)[:, None] * rows + column[None, :], tl.trans(v),
             mask=(dims < V_DIM)[:, None] & in_rows[None, :])
    if head == 0:
        k_pe = _rounded_rows(K_PE, key, valid, stride_kp_token, k_scale, ROPE, ROPE_P2)
        _store_rows(K_PE8, row, in_rows, k_pe, ROPE, ROPE, ROPE_P2)
        tl.store(KEY_ROWS + key, row.to(tl.int64), mask=valid)
        tl.store(VALUE_COLUMNS + key, column.to(tl.int64), mask=valid)


@triton.jit
def _round_queries(block, Q, Q8, scale, count, stride_token, stride_head, HEADS: tl.constexpr, QK: tl.constexpr,
                   QK_P2: tl.constexpr, BLOCK: tl.constexpr):
    """q's (token, head) rows `block * BLOCK` on, of `count`, into the contiguous Q8."""
    n = block * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, QK_P2)
    ok = (n < count)[:, None] & (cols < QK)[None, :]
    x = tl.load(Q + _row_offsets(n, stride_token, stride_head, HEADS)[:, None] + cols[None, :], mask=ok, other=0.0)
    tl.store(Q8 + n.to(tl.int64)[:, None] * QK + cols[None, :], _e4m3(x, scale), mask=ok)


@triton.jit(do_not_specialize=["queries", "keys", "segments", "search_steps"])
def _round_kernel(
    Q, K_NOPE, K_PE, V, TENSOR_SCALES, CU_SEQLENS, KEY_STARTS, Q8, K_NOPE8, K_PE8, V_T, KEY_ROWS, VALUE_COLUMNS,
    queries, keys, rows, segments, search_steps,
    stride_q_token, stride_q_head, stride_kn_token, stride_kn_head, stride_kp_token, stride_v_token, stride_v_head,
    HEADS: tl.constexpr, QK: tl.constexpr, QK_P2: tl.constexpr, NOPE: tl.constexpr, NOPE_P2: tl.constexpr,
    ROPE: tl.constexpr, ROPE_P2: tl.constexpr, V_DIM: tl.constexpr, V_DIM_P2: tl.constexpr,
    BLOCK_KEYS: tl.constexpr, BLOCK_QUERIES: tl.constexpr,
):
    program = tl.program_id(0)
    key_programs = tl.cdiv(rows, BLOCK_KEYS) * HEADS
    if program < key_programs:
        _round_keys(program, K_NOPE, K_PE, V, tl.load(TENSOR_SCALES + 1), tl.load(TENSOR_SCALES + 2), CU_SEQLENS,
                    KEY_STARTS, K_NOPE8, K_PE8, V_T, KEY_ROWS, VALUE_COLUMNS, keys, rows, segments, search_steps,
                    stride_kn_token, stride_kn_head, stride_kp_token, stride_v_token, stride_v_head, HEADS, NOPE, NOPE_P2,
                    ROPE, ROPE_P2, V_DIM, V_DIM_P2, BLOCK_KEYS)
    else:
        _round_queries(program - key_programs, Q, Q8, tl.load(TENSOR_SCALES), queries * HEADS, stride_q_token, stride_q_head, HEADS,
                       QK, QK_P2, BLOCK_QUERIES)


def round_operands(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, *, tiles: RoundingTiles | None = None) -> E4m3Operands:
    """q `[T, H, d_qk]`, k_nope `[Tk, H, d_nope]`, k_pe `[Tk, d_rope]` and v `[Tk, H, d_v]` (bf16, fp16 or float32,
    views with contiguous last dims) in e4m3, each scaled so that its largest magnitude maps to e4m3's largest
    (k_nope and k_pe share k's scale; `scales`: q's times k's, and v's), the keys of each segment of
    `cu_seqlens_k` (int32 offsets) moved to start at a multiple of KEY_ALIGNMENT rows (`output_rows` of them), v
    transposed (`Fp8PrefillOperands` describes the layout). No host sync: the row count comes from the shapes.

    >>> device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs it under Triton's interpreter
    >>> x = torch.tensor([[[1.0, -0.5]], [[0.0, 2.0]]], device=device)
    >>> ops = round_operands(x, x, x[:, 0], x, torch.tensor([0, 1, 2], dtype=torch.int32, device=device))
    >>> ops.q.float().flatten().tolist(), ops.v_t[0, :, 16].float().tolist()  # v's key 1 went to row 16
    ([224.0, -112.0, 0.0, 448.0], [0.0, 448.0])
    >>> torch.allclose(ops.scales.cpu(), torch.tensor([(2 / 448) ** 2, 2 / 448]))
    True
    >>> ops.key_starts.tolist(), ops.key_rows.tolist(), ops.value_columns.tolist()
    ([0, 16, 32], [0, 16], [0, 16])
    """
    _check(q, k_nope, k_pe, v, cu_seqlens_k)
    tiles = tiles or (INTERPRETER_TILES if INTERPRET else DEFAULT_TILES)
    inputs = (q, k_nope, k_pe, v)
    strides = (q.stride(0), q.stride(1), k_nope.stride(0), k_nope.stride(1), k_pe.stride(0), v.stride(0), v.stride(1))
    widths = _widths(*inputs)
    partial = _largest_partials(inputs, strides, widths, tiles)
    tensor_scales, scales, key_starts = _plan(partial, cu_seqlens_k, tiles)
    rows = output_rows(k_nope.shape[0], cu_seqlens_k.shape[0] - 1)
    out = _empty_operands(q, k_nope, k_pe, v, rows, scales, key_starts)
    tokens, heads, _ = q.shape
    segments = cu_seqlens_k.shape[0] - 1
    grid = (triton.cdiv(rows, tiles.key_rows) * heads + triton.cdiv(tokens * heads, tiles.query_rows), 1, 1)
    if grid[0] > 0:
        _launch(_ROUND, grid, (*inputs, tensor_scales, cu_seqlens_k, key_starts, *out[:4], out.key_rows,
                               out.value_columns, tokens, k_nope.shape[0], rows, segments, segments.bit_length(),
                               *strides),
                dict(widths, BLOCK_KEYS=tiles.key_rows,
                     BLOCK_QUERIES=tiles.query_rows, num_warps=tiles.num_warps))
    return out


def _largest_partials(inputs: tuple[torch.Tensor, ...], strides: tuple[int, ...], widths: Mapping[str, int],
                      tiles: RoundingTiles) -> torch.Tensor:
    """float32 `[3, programs]`: each `_largest_kernel` program's largest magnitudes of q, k and v."""
    q, k_nope = inputs[:2]
    tokens, heads, keys = q.shape[0], q.shape[1], k_nope.shape[0]
    blocks = {f"BLOCK_{name}": max(1, tiles.largest_elements // widths[f"{name}_P2"]) for name in _WIDTHS}
    most_tiles = max(triton.cdiv(tokens * heads, blocks["BLOCK_QK"]),
                     triton.cdiv(keys * heads, min(blocks["BLOCK_NOPE"], blocks["BLOCK_V_DIM"])))
    programs = max(1, min(tiles.largest_programs, most_tiles))
    partial = torch.empty(3, programs, dtype=torch.float32, device=q.device)
    _launch(_LARGEST, (programs, 1, 1), (*inputs, partial, tokens, keys, *strides),
            dict(widths, **blocks, num_warps=tiles.num_warps))
    return partial


def output_rows(keys: int, segments: int) -> int:
    """The rows of k_nope, k_pe and v_t's keys once each of `segments` segments starts at a multiple of
    KEY_ALIGNMENT (the most padding they can need), a multiple of KEY_ALIGNMENT.

    >>> output_rows(9, 2), output_rows(0, 0)
    (48, 0)
    """
    return -(-(keys + (KEY_ALIGNMENT - 1) * segments) // KEY_ALIGNMENT) * KEY_ALIGNMENT


def _plan(partial: torch.Tensor, cu_seqlens_k: torch.Tensor,
          tiles: RoundingTiles) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q's, k's and v's scales (float32 `[3]`), `scales` (`[2]`) and `key_starts` (int32 `[segments + 1]`)."""
    device, programs = partial.device, partial.shape[1]
    segments = cu_seqlens_k.shape[0] - 1
    tensor_scales = torch.empty(3, dtype=torch.float32, device=device)
    scales = torch.empty(2, dtype=torch.float32, device=device)
    key_starts = torch.empty(segments + 1, dtype=torch.int32, device=device)
    _launch(_PLAN, (1, 1, 1), (partial, cu_seqlens_k, tensor_scales, scales, key_starts, programs, segments),
            dict(PROGRAMS_P2=triton.next_power_of_2(programs), BLOCK_SEGMENTS=tiles.segments,
                 num_warps=tiles.num_warps))
    return tensor_scales, scales, key_starts


def _empty_operands(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor, rows: int,
                    scales: torch.Tensor, key_starts: torch.Tensor) -> E4m3Operands:
    """The unwritten outputs (`_round_kernel` writes every element)."""
    device, (tokens, heads, qk), keys = q.device, q.shape, k_nope.shape[0]
    return E4m3Operands(
        q=torch.empty(tokens, heads, qk, dtype=FP8_DTYPE, device=device),
        k_nope=torch.empty(rows, heads, k_nope.shape[2], dtype=FP8_DTYPE, device=device),
        k_pe=torch.empty(rows, k_pe.shape[1], dtype=FP8_DTYPE, device=device),
        v_t=torch.empty(heads, v.shape[2], rows, dtype=FP8_DTYPE, device=device),
        scales=scales, key_starts=key_starts,
        key_rows=torch.empty(keys, dtype=torch.int64, device=device),
        value_columns=torch.empty(keys, dtype=torch.int64, device=device))


_WIDTHS = ("QK", "NOPE", "ROPE", "V_DIM")


def _widths(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor) -> dict[str, int]:
    """The kernels' width constants: the heads, each input's last dim and its next power of two."""
    widths = dict(zip(_WIDTHS, (q.shape[2], k_nope.shape[2], k_pe.shape[1], v.shape[2])))
    return dict(HEADS=q.shape[1], **widths, **{f"{name}_P2": triton.next_power_of_2(w) for name, w in widths.items()})


def _launch(kernel: CachedLaunch, grid: tuple[int, int, int], args: tuple, constants: Mapping[str, object]) -> None:
    """`kernel` keyed by what Triton specializes it on: the tensors' dtypes and 16-byte alignment, whether each
    integer is 1 or a multiple of 16, and the constants."""
    key = tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else (a == 1, a % 16 == 0)
                for a in args)
    kernel((key, tuple(sorted(constants.items()))), grid, args, constants)


def _check(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
           cu_seqlens_k: torch.Tensor) -> None:
    """Refuses what the kernels cannot read (no value of any tensor is read)."""
    if q.device.type != "cuda" and not INTERPRET:
        raise MLAInputError(f"q: the e4m3 rounding runs Triton kernels, on CUDA tensors (CPU ones under "
                            f"TRITON_INTERPRET=1), got {q.device}")
    for name, tensor, dims in (("q", q, 3), ("k_nope", k_nope, 3), ("k_pe", k_pe, 2), ("v", v, 3)):
        if tensor.dim() != dims or tensor.dtype not in DTYPES or tensor.stride(-1) != 1 or tensor.device != q.device:
            raise MLAInputError(f"{name}: expected a {dims}-d bf16, fp16 or float32 tensor on {q.device} with a "
                                f"contiguous last dim, got {tensor.dtype} {tuple(tensor.shape)} with strides "
                                f"{tensor.stride()} on {tensor.device}")
    keys, heads = k_nope.shape[0], q.shape[1]
    if k_nope.shape[1] != heads or v.shape[:2] != k_nope.shape[:2] or k_pe.shape[0] != keys:
        raise MLAInputError(f"k_nope, k_pe, v: expected [keys, {heads}, d_nope], [keys, d_rope] and [keys, {heads}, "
                            f"d_v], got {tuple(k_nope.shape)}, {tuple(k_pe.shape)} and {tuple(v.shape)}")
    if cu_seqlens_k.dim() != 1 or cu_seqlens_k.shape[0] == 0 or cu_seqlens_k.dtype != torch.int32 \
            or cu_seqlens_k.device != q.device:
        raise MLAInputError(f"cu_seqlens_k: expected int32 [segments + 1] on {q.device}, got {cu_seqlens_k.dtype} "
                            f"{tuple(cu_seqlens_k.shape)} on {cu_seqlens_k.device}")


_LARGEST = CachedLaunch(_largest_kernel)
_PLAN = CachedLaunch(_plan_kernel)
_ROUND = CachedLaunch(_round_kernel)
