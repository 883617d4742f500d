"""Fused cache write: new tokens' `[c_kv ; k_pe]` rows into their page slots, quantized for fp8.

One program per row; a slot of -1 marks padding (CUDA-graph batches padded to a bucket)
and is skipped, as is any slot outside the cache (the slot count is an argument), so no slot
writes out of bounds. fp8 stores `value / scale` saturated at the fp8 range: with one scale for
the tensor, or with per-token, per-128-channel-group scales computed here from each group's
largest finite magnitude (the same rule as `mlakit.cache.kv_quant.quantize_rows_per_group`).
Non-finite inputs are stored as NaN, and each fp8 row atomically adds its saturated and
non-finite value counts to an int64 `[2]` counter. No host sync, so the write can be captured
in a CUDA graph. Divisions are IEEE-rounded (`div_rn`), so the stored bytes and the counts
equal the torch quantizer's.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mlakit.kernels.interpreter import INTERPRET
from mlakit.kernels.launch import CachedLaunch
from mlakit.cache.kv_quant import FP8_MAX, FP8_SATURATION, SCALE_GROUP, num_scale_groups, scale_mode

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
FP8_NAN_BITS = tl.constexpr(0x7F)


@triton.jit
def _round_to_e4m3_grid(x):
    """x rounded to the nearest e4m3 value (3 mantissa bits, smallest normal exponent -6), so the
    interpreter's bitwise fp8 cast, which can drop a rounding carry, has nothing left to round.
    The sign is kept, so values that round to zero keep it as the GPU's cast does (-0)."""
    magnitude = tl.abs(x)
    exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(magnitude, 1e-30))), -6.0)
    step = tl.exp2(exponent - 3.0)
    rounded = tl.floor(magnitude / step + 0.5) * step
    return rounded * tl.where(x.to(tl.int32, bitcast=True) < 0, -1.0, 1.0)


@triton.jit
def _saturating_fp8(scaled, finite, COUNTS, FP8_TYPE: tl.constexpr, FP8_LIMIT: tl.constexpr, SATURATION: tl.constexpr):
    """`scaled` in fp8, clamped to +-FP8_LIMIT, NaN where the input was not finite; adds the
    row's saturated and non-finite counts to COUNTS[0] and COUNTS[1]."""
    saturated = tl.sum((finite & (tl.abs(scaled) >= SATURATION)).to(tl.int64), 0)
    non_finite = tl.sum((~finite).to(tl.int64), 0)
    tl.atomic_add(COUNTS, saturated, mask=saturated > 0)
    tl.atomic_add(COUNTS + 1, non_finite, mask=non_finite > 0)
    clamped = tl.minimum(tl.maximum(scaled, -FP8_LIMIT), FP8_LIMIT)
    if INTERPRET:
        clamped = _round_to_e4m3_grid(clamped)
    # The NaN goes in as bits: GPU casts saturate inf to 448 and the interpreter's cast garbles NaN.
    nan = tl.full(scaled.shape, FP8_NAN_BITS, tl.uint8).to(FP8_TYPE, bitcast=True)
    return tl.where(finite, clamped.to(FP8_TYPE), nan)


@triton.jit(do_not_specialize=["num_slots"])
def _write_rows_kernel(
    ROWS, SLOTS, DATA, SCALE, COUNTS, num_slots, stride_row, stride_col,
    DIM: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr, GROUPS_PAD: tl.constexpr,
    SCALE_MODE: tl.constexpr, FP8_LIMIT: tl.constexpr, SATURATION: tl.constexpr, FINITE_MAX: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(SLOTS + row).to(tl.int64)
    if (slot < 0) | (slot >= num_slots):
        return
    cols = tl.arange(0, GROUPS_PAD * GROUP)
    in_row = cols < DIM
    values = tl.load(ROWS + row * stride_row + cols * stride_col, mask=in_row, other=0.0).to(tl.float32)
    if SCALE_MODE == 0:
        out = values.to(DATA.dtype.element_ty)
    else:
        finite = tl.abs(values) <= FINITE_MAX
        if SCALE_MODE == 1:
            scaled = tl.div_rn(values, tl.load(SCALE))
        else:
            amax = tl.max(tl.reshape(tl.where(finite, tl.abs(values), 0.0), [GROUPS_PAD, GROUP]), 1)
            scales = tl.where(amax > 0, tl.div_rn(amax, FP8_LIMIT), 1.0)
            scaled = tl.reshape(tl.div_rn(tl.reshape(values, [GROUPS_PAD, GROUP]), scales[:, None]), [GROUPS_PAD * GROUP])
            groups = tl.arange(0, GROUPS_PAD)
            tl.store(SCALE + slot * GROUPS + groups, scales, mask=groups < GROUPS)
        out = _saturating_fp8(scaled, finite, COUNTS, DATA.dtype.element_ty, FP8_LIMIT, SATURATION)
    tl.store(DATA + slot * DIM + cols, out, mask=in_row)


def write_rows(
    data: torch.Tensor, scale: torch.Tensor | None, slots: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor | None = None
) -> None:
    """Writes `rows [n, dim]` (any strides) into contiguous `data [num_pages, page_size, dim]` at flat
    `slots [n]` (page * page_size + offset; shapes checked by `LatentStore.write_slots`), updating per-group fp8
    `scale` in place and adding the saturated and non-finite value counts to `counts` (int64 `[2]`, required for
    fp8 data). A slot outside [0, num_pages * page_size), such as the -1 of padding, is skipped: nothing of its row
    is written or counted.

    Used as `write_rows(store.data, store.scale, slots, torch.cat([c_kv, k_pe], dim=1), store.fp8_counts)`
    (`LatentStore.write_slots` does so on CUDA).
    """
    dim = data.shape[-1]
    if not data.is_contiguous():
        raise ValueError("data: expected a contiguous [num_pages, page_size, dim] tensor")
    mode = scale_mode(data, scale)
    if mode != 0 and (counts is None or counts.dtype != torch.int64 or counts.numel() != 2):
        raise ValueError("counts: expected an int64 [2] tensor (saturated, non-finite) for an fp8 write")
    if rows.shape[0] == 0:
        return
    scale_arg = scale if scale is not None else data
    counts_arg = counts if counts is not None else data
    tensors = (rows, slots, data, scale_arg, counts_arg)
    num_slots = data.numel() // dim
    # Triton types an unspecialized int argument i32 or i64 by its value.
    key = (tuple([(t.dtype, t.data_ptr() % 16) for t in tensors]), num_slots < 2**31, rows.stride(0), rows.stride(1),
           dim, mode)
    _WRITE_ROWS(key, (rows.shape[0], 1, 1), (*tensors, num_slots, rows.stride(0), rows.stride(1)), _constants(dim, mode))


@functools.lru_cache(maxsize=32)
def _constants(dim: int, mode: int) -> dict[str, object]:
    """The write kernel's constexprs for `dim`-wide rows and scale mode `mode` (kept: computing them costs host time)."""
    groups = num_scale_groups(dim)
    return dict(DIM=dim, GROUPS=groups, GROUP=SCALE_GROUP, GROUPS_PAD=triton.next_power_of_2(groups), SCALE_MODE=mode,
                FP8_LIMIT=FP8_MAX, SATURATION=FP8_SATURATION, FINITE_MAX=FLOAT32_MAX)


_WRITE_ROWS = CachedLaunch(_write_rows_kernel)
