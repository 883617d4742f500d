"""Fused cache write: new tokens' `[c_kv ; k_pe]` rows into their page slots, quantized for fp8.

One program per row; a slot of -1 marks padding (CUDA-graph batches padded to a bucket)
and is skipped. fp8 stores `value / scale` saturated at the fp8 range: with one scale for
the tensor, or with per-token, per-128-channel-group scales computed here from each group's
largest magnitude (the same rule as `mlakit.cache.kv_quant.quantize_rows_per_group`). No host
sync, so the write can be captured in a CUDA graph. Divisions are IEEE-rounded (`div_rn`),
so the stored bytes equal the torch quantizer's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlakit.kernels.interpreter import INTERPRET
from mlakit.cache.kv_quant import FP8_MAX, SCALE_GROUP, num_scale_groups, scale_mode


@triton.jit
def _round_to_e4m3_grid(x):
    """x rounded to the nearest e4m3 value (3 mantissa bits, smallest normal exponent -6), so the
    interpreter's bitwise fp8 cast, which can drop a rounding carry, has nothing left to round."""
    exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(tl.abs(x), 1e-30))), -6.0)
    step = tl.exp2(exponent - 3.0)
    return tl.floor(x / step + 0.5) * step


@triton.jit
def _write_rows_kernel(
    ROWS, SLOTS, DATA, SCALE, stride_row,
    DIM: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr, GROUPS_PAD: tl.constexpr,
    SCALE_MODE: tl.constexpr, FP8_LIMIT: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(SLOTS + row).to(tl.int64)
    if slot < 0:
        return
    cols = tl.arange(0, GROUPS_PAD * GROUP)
    in_row = cols < DIM
    values = tl.load(ROWS + row * stride_row + cols, mask=in_row, other=0.0).to(tl.float32)
    if SCALE_MODE == 1:
        values = tl.minimum(tl.maximum(tl.div_rn(values, tl.load(SCALE)), -FP8_LIMIT), FP8_LIMIT)
    elif SCALE_MODE == 2:
        grouped = tl.reshape(values, [GROUPS_PAD, GROUP])
        amax = tl.max(tl.abs(grouped), 1)
        scales = tl.where(amax > 0, tl.div_rn(amax, FP8_LIMIT), 1.0)
        grouped = tl.minimum(tl.maximum(tl.div_rn(grouped, scales[:, None]), -FP8_LIMIT), FP8_LIMIT)
        values = tl.reshape(grouped, [GROUPS_PAD * GROUP])
        groups = tl.arange(0, GROUPS_PAD)
        tl.store(SCALE + slot * GROUPS + groups, scales, mask=groups < GROUPS)
    if INTERPRET and SCALE_MODE != 0:
        values = _round_to_e4m3_grid(values)
    tl.store(DATA + slot * DIM + cols, values.to(DATA.dtype.element_ty), mask=in_row)


def write_rows(data: torch.Tensor, scale: torch.Tensor | None, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """Writes `rows [n, dim]` into contiguous `data [num_pages, page_size, dim]` at flat `slots [n]`
    (page * page_size + offset, -1 = skip), updating per-group fp8 `scale` in place.

    Used as `write_rows(store.data, store.scale, slots, torch.cat([c_kv, k_pe], dim=1))`
    (`LatentStore.write_slots` does so on CUDA).
    """
    dim = data.shape[-1]
    if not data.is_contiguous():
        raise ValueError("data: expected a contiguous [num_pages, page_size, dim] tensor")
    mode = scale_mode(data, scale)
    groups = num_scale_groups(dim)
    if rows.shape[0] == 0:
        return
    _write_rows_kernel[(rows.shape[0],)](
        rows, slots, data, scale if scale is not None else data, rows.stride(0),
        DIM=dim, GROUPS=groups, GROUP=SCALE_GROUP, GROUPS_PAD=triton.next_power_of_2(groups),
        SCALE_MODE=mode, FP8_LIMIT=FP8_MAX,
    )
