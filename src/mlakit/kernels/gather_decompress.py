"""One Triton kernel for the MHA-form prefill's gather and decompression of 16-bit caches:
the latent rows at `slots` times `kv_b_proj`'s weight, and their rope keys copied alongside,
written into one buffer whose views are `prefill.mha.decompress`'s `k_nope`, `k_pe` and `v`.

It replaces an index_select and a cuBLAS GEMM (two launches and their host time per pass).
One program owns a BLOCK_M x BLOCK_N tile of the GEMM: it loads its rows' latents straight from
the cache (the gather) and accumulates in float32; the programs of the first column tile also
copy their rows' rope keys. fp8 caches keep the torch path (`supports` says which).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from mlakit.errors import MLAInputError
from mlakit.kernels.interpreter import INTERPRET
from mlakit.kernels.launch import CachedLaunch

if TYPE_CHECKING:
    from mlakit.kernels.hopper_common import Matrix

DTYPES = (torch.bfloat16, torch.float16)
# Output rows (and the rope columns within them) start on this many bytes.
ROW_ALIGNMENT = 16


@dataclasses.dataclass(frozen=True)
class GatherTuning:
    """Tile sizes (powers of two >= 16) and launch settings of the gather-decompress kernel."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise MLAInputError(f"GatherTuning.{name}: expected a power of two >= 16, got {value}")


DEFAULT_TUNING = GatherTuning()
INTERPRETER_TUNING = GatherTuning(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1)


@triton.jit
def _accumulate(acc, row_ptrs, weight_ptrs, k, row_mask, weight_mask):
    """acc plus the rows' latents at channels `k` times the weight rows' channels `k`, transposed."""
    a = tl.load(row_ptrs[:, None] + k[None, :], mask=row_mask, other=0.0)
    b = tl.load(weight_ptrs[:, None] + k[None, :], mask=weight_mask, other=0.0)
    if INTERPRET:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, tl.trans(b), acc)


@triton.jit(do_not_specialize=["m"])  # a prefill pass's row count: any value, one kernel (warm_up runs a few)
def _gather_decompress_kernel(
    ROWS, SLOTS, WEIGHT, OUT, m, row_stride, weight_stride,
    RANK: tl.constexpr, ROPE: tl.constexpr, N: tl.constexpr, ROPE_AT: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    token_ok = tokens < m
    slots = tl.load(SLOTS + tokens, mask=token_ok, other=0).to(tl.int64)
    row_ptrs = ROWS + slots * row_stride
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    weight_ptrs = WEIGHT + cols.to(tl.int64) * weight_stride
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, RANK - RANK % BLOCK_K, BLOCK_K):
        acc = _accumulate(acc, row_ptrs, weight_ptrs, k0 + k, token_ok[:, None], col_ok[:, None])
    if RANK % BLOCK_K != 0:
        k_edge = RANK - RANK % BLOCK_K + k
        k_ok = k_edge < RANK
        acc = _accumulate(acc, row_ptrs, weight_ptrs, k_edge, token_ok[:, None] & k_ok[None, :],
                          col_ok[:, None] & k_ok[None, :])
    out_rows = OUT + tokens.to(tl.int64)[:, None] * WIDTH
    tl.store(out_rows + cols[None, :], acc.to(OUT.dtype.element_ty), mask=token_ok[:, None] & col_ok[None, :])
    if tl.program_id(1) == 0:
        for c0 in tl.static_range(0, ROPE, BLOCK_K):
            rope = c0 + k
            ok = token_ok[:, None] & (rope < ROPE)[None, :]
            values = tl.load(row_ptrs[:, None] + RANK + rope[None, :], mask=ok)
            tl.store(out_rows + ROPE_AT + rope[None, :], values, mask=ok)


def supports(rows: torch.Tensor, kv_b_weight: torch.Tensor) -> bool:
    """Whether `gather_decompress` takes these: both bf16 or both fp16, last dims contiguous.

    >>> supports(torch.zeros(4, 10, dtype=torch.bfloat16), torch.zeros(6, 8, dtype=torch.bfloat16))
    True
    >>> supports(torch.zeros(4, 10, dtype=torch.float8_e4m3fn), torch.zeros(6, 8, dtype=torch.bfloat16))
    False
    """
    return (rows.dtype in DTYPES and kv_b_weight.dtype == rows.dtype
            and rows.stride(-1) == 1 and kv_b_weight.stride(-1) == 1)


@dataclasses.dataclass(frozen=True)
class GatherLaunch:
    """`gather_decompress` for `m` slots and operands of one layout (shapes, strides, dtypes, pointer
    alignment): calling it with `(rows, slots, kv_b_weight)` of that layout allocates the buffer, launches
    and returns the three views; `launch` writes a buffer the caller holds. Made by `plan_gather`; a prepared
    prefill keeps one per pass."""

    key: tuple
    grid: tuple[int, int, int]
    strides: tuple[int, int]
    constants: Mapping[str, object]
    m: int
    heads: int
    nope_dim: int
    per_head: int
    rope: int
    rope_at: int
    width: int
    dtype: torch.dtype

    def buffer(self, device: torch.device) -> torch.Tensor:
        """A new (unwritten) buffer of this launch's rows."""
        return torch.empty(self.m, self.width, dtype=self.dtype, device=device)

    def views(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`k_nope [m, H, d_nope]`, `k_pe [m, d_rope]` and `v [m, H, d_v]` in `buf`."""
        width, per_head = self.width, self.per_head
        return (buf.as_strided((self.m, self.heads, self.nope_dim), (width, per_head, 1)),
                buf.as_strided((self.m, self.rope), (width, 1), self.rope_at),
                buf.as_strided((self.m, self.heads, per_head - self.nope_dim), (width, per_head, 1), self.nope_dim))

    def matrices(self, buf: torch.Tensor) -> tuple[Matrix, Matrix, Matrix]:
        """`views(buf)` as `(address, dtype, shape, strides)` matrices of token rows whose columns run over
        every head's span (how TMA descriptors read them), computed from `buf`'s address alone."""
        address, size, per_head = buf.data_ptr(), buf.element_size(), self.per_head
        return ((address, self.dtype, (self.m, (self.heads - 1) * per_head + self.nope_dim), (self.width, 1)),
                (address + self.rope_at * size, self.dtype, (self.m, self.rope), (self.width, 1)),
                (address + self.nope_dim * size, self.dtype, (self.m, self.heads * per_head - self.nope_dim),
                 (self.width, 1)))

    def launch(self, rows: torch.Tensor, slots: torch.Tensor, kv_b_weight: torch.Tensor, buf: torch.Tensor) -> None:
        """Launches the kernel into `buf` (a `buffer`, or a 16-byte aligned tensor of its shape and dtype). Of
        `rows` the kernel reads the address (the strides are the planned ones): the paged cache whose pages are
        those rows serves as well as the `[rows, width]` view of it."""
        if self.m > 0:
            _GATHER_DECOMPRESS(self.key, self.grid, (rows, slots, kv_b_weight, buf, self.m, *self.strides),
                               self.constants)

    def __call__(self, rows: torch.Tensor, slots: torch.Tensor,
                 kv_b_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        buf = self.buffer(rows.device)
        self.launch(rows, slots, kv_b_weight, buf)
        return self.views(buf)


def plan_gather(rows: torch.Tensor, slots: torch.Tensor, kv_b_weight: torch.Tensor, heads: int, nope_dim: int,
                *, tuning: GatherTuning | None = None) -> GatherLaunch:
    """The launch of `gather_decompress` for these operands' layout; refuses what the kernel cannot read."""
    _check(rows, slots, kv_b_weight, heads)
    if tuning is None:
        tuning = INTERPRETER_TUNING if INTERPRET else DEFAULT_TUNING
    m = slots.shape[0]
    n, rank = kv_b_weight.shape
    rope = rows.shape[1] - rank
    align = ROW_ALIGNMENT // rows.element_size()
    rope_at = -(-n // align) * align
    width = -(-(rope_at + rope) // align) * align
    strides = (rows.stride(0), kv_b_weight.stride(0))
    # The buffer is a fresh allocation: 16-byte aligned, like every torch.empty on a GPU.
    key = (rows.dtype, slots.dtype, rank, rope, n, tuning,
           tuple((s == 1, s % 16 == 0) for s in strides),
           tuple(t.data_ptr() % 16 == 0 for t in (rows, slots, kv_b_weight)))
    grid = (triton.cdiv(m, tuning.block_m), triton.cdiv(n, tuning.block_n), 1)
    constants = dict(RANK=rank, ROPE=rope, N=n, ROPE_AT=rope_at, WIDTH=width, BLOCK_M=tuning.block_m,
                     BLOCK_N=tuning.block_n, BLOCK_K=tuning.block_k, num_warps=tuning.num_warps,
                     num_stages=tuning.num_stages)
    return GatherLaunch(key, grid, strides, MappingProxyType(constants), m, heads, nope_dim, n // heads, rope, rope_at,
                        width, rows.dtype)


def gather_decompress(
    rows: torch.Tensor, slots: torch.Tensor, kv_b_weight: torch.Tensor, heads: int, nope_dim: int,
    *, tuning: GatherTuning | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`decompress(rows[slots], kv_b_weight, heads, nope_dim)` in one launch: `k_nope [m, H, d_nope]`,
    `k_pe [m, d_rope]` and `v [m, H, d_v]` from cache rows `[num_rows, kv_lora_rank + d_rope]` at
    `slots [m]` (int32 or int64, all valid) through `kv_b_weight [H * (d_nope + d_v), kv_lora_rank]`
    (rows' dtype, bf16 or fp16; last dims contiguous). The GEMM accumulates in float32; the three
    are views of one buffer whose rows, and rope columns, start 16-byte aligned.

    >>> device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs it under Triton's interpreter
    >>> rows = torch.randn(7, 16 + 8, device=device).half()
    >>> weight = torch.randn(2 * (16 + 16), 16, device=device).half()
    >>> k_nope, k_pe, v = gather_decompress(rows, torch.tensor([6, 0, 6], device=device), weight, heads=2, nope_dim=16)
    >>> k_nope.shape, k_pe.shape, v.shape
    (torch.Size([3, 2, 16]), torch.Size([3, 8]), torch.Size([3, 2, 16]))
    >>> want = (rows[[6, 0, 6], :16].float() @ weight.float().t()).view(3, 2, 32)
    >>> torch.allclose(v.float(), want[..., 16:], rtol=1e-2, atol=1e-2), torch.equal(k_pe, rows[[6, 0, 6], 16:])
    (True, True)
    """
    return plan_gather(rows, slots, kv_b_weight, heads, nope_dim, tuning=tuning)(rows, slots, kv_b_weight)


def _check(rows: torch.Tensor, slots: torch.Tensor, kv_b_weight: torch.Tensor, heads: int) -> None:
    """Refuses what the kernel cannot read (no value of any tensor is read)."""
    if rows.dtype not in DTYPES:
        raise MLAInputError(f"rows: expected a bf16 or fp16 cache, got {rows.dtype} (fp8 caches take "
                            f"prefill.mha.gather_rows + decompress)")
    if kv_b_weight.dtype != rows.dtype:
        raise MLAInputError(f"kv_b_weight: expected rows' dtype {rows.dtype}, got {kv_b_weight.dtype}")
    if rows.stride(-1) != 1 or kv_b_weight.stride(-1) != 1:
        raise MLAInputError(f"rows, kv_b_weight: expected contiguous last dims, got strides {rows.stride()} and "
                            f"{kv_b_weight.stride()}")
    if slots.shape[0] > 1 and slots.stride(0) != 1:
        raise MLAInputError(f"slots: expected a contiguous [m] tensor, got stride {slots.stride(0)}")
    if kv_b_weight.shape[0] % heads != 0:
        raise MLAInputError(f"kv_b_weight: expected a row count that is a multiple of heads={heads}, got "
                            f"{kv_b_weight.shape[0]} rows")


_GATHER_DECOMPRESS = CachedLaunch(_gather_decompress_kernel)
