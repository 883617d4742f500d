"""One Triton kernel that merges the partial attention results several ranks computed over
disjoint keys (decode context parallelism): every rank's output row weighted by its
log-sum-exp, in float32, written in the output dtype with the merged lse.

It replaces a chain of elementwise torch operations per rank (a dozen launches per layer, most
of a small DCP step's time outside the collectives).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlakit.errors import MLAInputError
from mlakit.kernels.launch import CachedLaunch

# One program's tile: rows x channels (a 128-head, 512-wide merge of one token is 16 x 4 programs).
BLOCK_ROWS = 8
BLOCK_CHANNELS = 128


@triton.jit(do_not_specialize=["part_rank_stride", "lse_rank_stride"])
def _merge_partials_kernel(
    PARTS, PART_LSE, OUT, LSE, rows, part_rank_stride, part_row_stride, lse_rank_stride, lse_row_stride,
    RANKS: tl.constexpr, DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = row < rows
    row = row.to(tl.int64)  # offsets in int64: the exchange buffer may pass 2^31 elements
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = row_ok[:, None] & (cols < DIM)[None, :]
    lse_rows = PART_LSE + row * lse_row_stride
    part_rows = PARTS + row[:, None] * part_row_stride + cols[None, :]
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    for rank in tl.static_range(RANKS):
        m = tl.maximum(m, tl.load(lse_rows + rank * lse_rank_stride.to(tl.int64), mask=row_ok, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for rank in tl.static_range(RANKS):
        lse = tl.load(lse_rows + rank * lse_rank_stride.to(tl.int64), mask=row_ok, other=float("-inf"))
        weight = tl.exp(lse - m_safe)
        total += weight
        part = tl.load(part_rows + rank * part_rank_stride.to(tl.int64), mask=ok, other=0.0).to(tl.float32)
        acc += tl.where(weight[:, None] > 0, part * weight[:, None], 0.0)  # an empty part's row may hold anything
    safe_total = tl.where(total > 0, total, 1.0)
    tl.store(OUT + row[:, None] * DIM + cols[None, :], (acc / safe_total[:, None]).to(OUT.dtype.element_ty), mask=ok)
    if tl.program_id(1) == 0:
        tl.store(LSE + row, tl.where(total > 0, m_safe + tl.log(safe_total), float("-inf")), mask=row_ok)


def merge_partials(parts: torch.Tensor, part_lse: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention from `ranks` partial results over disjoint keys: `parts [ranks, rows, dim]`
    (any float dtype, channels contiguous) and `part_lse [ranks, rows]` (float32, natural log, -inf
    for a part that saw no key) give out `[rows, dim]` in `dtype` and lse `[rows]` float32; a row
    no part saw a key for gets zeros and -inf. Equals folding `reference.merge_attention_states`
    over the ranks, up to float rounding.

    >>> device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs it under Triton's interpreter
    >>> parts = torch.randn(2, 3, 8, device=device)
    >>> out, lse = merge_partials(parts, torch.zeros(2, 3, device=device), torch.float32)
    >>> torch.allclose(out, parts.mean(0), atol=1e-6), torch.allclose(lse.cpu(), torch.full((3,), 2.0).log())
    (True, True)
    """
    if parts.dim() != 3 or parts.stride(-1) != 1:
        raise MLAInputError(f"parts: expected [ranks, rows, dim] with contiguous channels, got shape {tuple(parts.shape)} "
                            f"and strides {parts.stride()}")
    if part_lse.shape != parts.shape[:2] or part_lse.dtype != torch.float32 or part_lse.device != parts.device:
        raise MLAInputError(f"part_lse: expected float32 {tuple(parts.shape[:2])} on {parts.device}, got "
                            f"{part_lse.dtype} {tuple(part_lse.shape)} on {part_lse.device}")
    ranks, rows, dim = parts.shape
    out = torch.empty(rows, dim, dtype=dtype, device=parts.device)
    lse = torch.empty(rows, dtype=torch.float32, device=parts.device)
    if rows == 0:
        return out, lse
    strides = (parts.stride(0), parts.stride(1), part_lse.stride(0), part_lse.stride(1))
    key = (parts.dtype, dtype, ranks, dim, rows == 1, rows % 16 == 0, strides,
           tuple(t.data_ptr() % 16 == 0 for t in (parts, part_lse, out, lse)))
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(dim, BLOCK_CHANNELS), 1)
    _MERGE(key, grid, (parts, part_lse, out, lse, rows, *strides),
           dict(RANKS=ranks, DIM=dim, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_CHANNELS))
    return out, lse


_MERGE = CachedLaunch(_merge_partials_kernel)
