"""The triton backend's MHA-form prefill prepared for one input layout.

What `mla_prefill` works out on every call (the checks, the backend, each pass's kernels, their tiles,
launch keys and grids) depends on the inputs' layout and the step's metadata, not on their addresses or
values. `prepare_prefill` works it out once; `mla_prefill` keeps the result in the step's
`PrefillMetadata` by layout (with `check_inputs=False`), so every later layer's call allocates its
outputs and launches, per pass, the gather-decompress (one fused kernel on small passes, index_select
and a cuBLAS GEMM on large ones) and the attention kernel.

The fused gathers write one buffer the prepared call holds (at most `FUSED_GATHER_LIMIT` key rows x
heads of rows: 32-40 MiB at DeepSeek's widths) for as long as the metadata lives, so the calls of one
metadata must run one after another on one stream, as a model's layers do (the decode plan's rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mlakit.kernels import gather_decompress
from mlakit.kernels.triton_prefill import LOG2E, AttentionLaunch, plan_attention
from mlakit.prefill.metadata import KeyRows, PrefillMetadata
from mlakit.prefill.mha import decompress, gather_and_decompress, head_dims, running_dtype, split_heads
from mlakit.reference import pages_view

if TYPE_CHECKING:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Passes of at most this many key rows x heads take the fused gather-decompress kernel: up to there it costs
# the GPU at most ~7 µs more than index_select + cuBLAS (0.85-1.05x their time on the H100) and saves ~40 µs
# of host time a call; beyond, cuBLAS is 1.2-1.3x faster (benchmarks/NOTES.md, "Eager prefill").
FUSED_GATHER_LIMIT = 65536


def fused_rows(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, kv_b_weight: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor | None:
    """The cache as one matrix of rows `[pages x page_size, width]` where the fused gather-decompress
    kernel reads it (a 16-bit cache of `dtype` without scales, `kv_b_weight` of the same dtype, pages
    one after another); None where the torch gather serves it.

    >>> fused_rows(torch.zeros(3, 16, 40, dtype=torch.bfloat16), None, torch.zeros(8, 32, dtype=torch.bfloat16),
    ...            torch.bfloat16).shape
    torch.Size([48, 40])
    """
    pages = pages_view(kv_cache)
    if kv_scale is not None or pages.dtype != dtype or not gather_decompress.supports(pages, kv_b_weight):
        return None
    try:
        return kv_cache.view(pages.shape[0] * pages.shape[1], pages.shape[2])
    except RuntimeError:  # pages at a stride: not one matrix of rows
        return None


@dataclasses.dataclass(frozen=True)
class TorchGather:
    """A pass's gather and decompression as index_select + cuBLAS GEMM, called as a `GatherLaunch` is."""

    heads: int
    nope_dim: int

    def __call__(self, rows: torch.Tensor, slots: torch.Tensor,
                 kv_b_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return decompress(rows.index_select(0, slots), kv_b_weight, self.heads, self.nope_dim)

    def sample(self, rows: torch.Tensor, slots: torch.Tensor,
               kv_b_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unwritten tensors laid out as a call's results (to plan the attention from, computing nothing)."""
        gathered = rows.new_empty(slots.shape[0], rows.shape[1])
        product = rows.new_empty(slots.shape[0], kv_b_weight.shape[0])
        return split_heads(product, gathered, kv_b_weight.shape[1], self.heads, self.nope_dim)


Gather = gather_decompress.GatherLaunch | TorchGather


def plan_gather(rows: torch.Tensor, slots: torch.Tensor, kv_b_weight: torch.Tensor, heads: int,
                nope_dim: int) -> Gather:
    """The gather of one pass over `rows` (from `fused_rows`): the fused kernel up to `FUSED_GATHER_LIMIT`
    key rows x heads, torch's beyond."""
    if slots.shape[0] * heads <= FUSED_GATHER_LIMIT:
        return gather_decompress.plan_gather(rows, slots, kv_b_weight, heads, nope_dim)
    return TorchGather(heads, nope_dim)


def decompress_rows(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, slots: torch.Tensor,
                    kv_b_weight: torch.Tensor, heads: int, nope_dim: int,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The triton backend's `RowDecompressor`: `plan_gather`'s choice where `fused_rows` serves the cache,
    else torch's gather (which also dequantizes fp8)."""
    rows = fused_rows(kv_cache, kv_scale, kv_b_weight, dtype)
    if rows is None:
        return gather_and_decompress(kv_cache, kv_scale, slots, kv_b_weight, heads, nope_dim, dtype)
    return plan_gather(rows, slots, kv_b_weight, heads, nope_dim)(rows, slots, kv_b_weight)


@dataclasses.dataclass(frozen=True)
class _Pass:
    """One attention pass whose keys and values torch gathers into new tensors every call."""

    slots: torch.Tensor
    cu_seqlens_k: torch.Tensor
    gather: TorchGather
    attend: AttentionLaunch

    def __call__(self, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor, q: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale_log2: float) -> None:
        k_nope, k_pe, v = self.gather(kv_cache.view(-1, kv_cache.shape[-1]), self.slots, kv_b_weight)
        self.attend(q, k_nope, k_pe, v, cu_seqlens_q, self.cu_seqlens_k, out, lse, scale_log2)


@dataclasses.dataclass(frozen=True)
class _HeldPass:
    """One attention pass whose fused gather writes a buffer the prepared call holds: what the attention reads
    of it (views, or for the Hopper kernel TMA descriptors of `GatherLaunch.matrices`) is made once, when planned."""

    slots: torch.Tensor
    cu_seqlens_k: torch.Tensor
    gather: gather_decompress.GatherLaunch
    buffer: torch.Tensor
    keys: tuple[torch.Tensor, ...] | tuple[TensorDescriptor, ...]
    attend: Callable[..., None]

    def __call__(self, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor, q: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale_log2: float) -> None:
        self.gather.launch(kv_cache, self.slots, kv_b_weight, self.buffer)
        self.attend(q, *self.keys, cu_seqlens_q, self.cu_seqlens_k, out, lse, scale_log2)


@dataclasses.dataclass(frozen=True)
class PreparedPrefill:
    """`mla_prefill` for inputs of one layout over one step's metadata:
    `call(q, kv_cache, kv_b_weight, kv_scale, softmax_scale, out=None, lse=None) -> (out, lse)`, writing the
    caller's `out` and `lse` (of the layout it was prepared for) where given. A sequence's prefix met in more than
    `MAX_16BIT_MERGES` chunks makes the passes merge in a float32 result (`out_dtype`: `running_dtype`), then
    copied into `out`."""

    out_shape: tuple[int, int, int]
    out_dtype: torch.dtype
    cu_seqlens_q: torch.Tensor
    passes: tuple[_Pass | _HeldPass, ...]

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor,
                 kv_scale: torch.Tensor | None, softmax_scale: float, out: torch.Tensor | None = None,
                 lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        direct = out is not None and self.out_dtype == q.dtype
        result = out if direct else torch.empty(self.out_shape, dtype=self.out_dtype, device=q.device)
        if lse is None:
            lse = torch.empty(self.out_shape[:2], dtype=torch.float32, device=q.device)
        scale_log2 = softmax_scale * LOG2E
        for step in self.passes:
            step(kv_cache, kv_b_weight, q, self.cu_seqlens_q, result, lse, scale_log2)
        if self.out_dtype == q.dtype:
            return result, lse
        return (result.to(q.dtype) if out is None else out.copy_(result)), lse


def prepare_prefill(meta: PrefillMetadata, q: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor,
                    kv_scale: torch.Tensor | None, out: torch.Tensor | None = None,
                    lse: torch.Tensor | None = None) -> PreparedPrefill | None:
    """The prefill of `meta` prepared for inputs (and the caller's `out` and `lse`, or None) of these ones'
    layout (already checked by `mla_prefill`), or None where the prepared path does not serve it: an fp8
    cache (scales), pages that are not one matrix of rows (`fused_rows`), a pass without key rows, no
    query rows, or a call inside CUDA-graph capture (where the zeroed launch counters of the persistent
    kernel would be zeroed only when the graph replays).

    >>> from mlakit.prefill.metadata import plan_prefill
    >>> device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs it under Triton's interpreter
    >>> cache = torch.randn(4, 16, 40, dtype=torch.bfloat16, device=device)
    >>> meta = plan_prefill([5], [20], torch.tensor([[3, 1]], dtype=torch.int32, device=device), page_size=16)
    >>> q = torch.randn(5, 2, 24, dtype=torch.bfloat16, device=device)
    >>> weight = torch.randn(2 * 32, 32, dtype=torch.bfloat16, device=device)
    >>> run = prepare_prefill(meta, q, cache, weight, None)
    >>> out, lse = run(q, cache, weight, None, 24**-0.5)
    >>> out.shape, lse.shape
    (torch.Size([5, 2, 16]), torch.Size([5, 2]))
    """
    if q.is_cuda and torch.cuda.is_current_stream_capturing():  # its buffers and counters would be filled on replay
        return None
    rows = fused_rows(kv_cache, kv_scale, kv_b_weight, q.dtype)
    if rows is None or meta.queries.total == 0 or any(keys.slots.shape[0] == 0 for keys, _ in meta.passes):
        return None
    heads = q.shape[1]
    nope_dim, v_dim = head_dims(q, rows.shape[1], kv_b_weight)
    out_shape = (q.shape[0], heads, v_dim)
    running = running_dtype(meta, q.dtype)
    if out is None or running != q.dtype:
        out = torch.empty(out_shape, dtype=running, device=q.device)
    if lse is None:
        lse = torch.empty(out_shape[:2], dtype=torch.float32, device=q.device)
    gathers = tuple(plan_gather(rows, keys.slots, kv_b_weight, heads, nope_dim) for keys, _ in meta.passes)
    scratch = _scratch(gathers, q.device)
    planned = tuple(_plan_pass(meta, keys, causal, index > 0, gather, scratch, rows, q, kv_b_weight, out, lse)
                    for index, ((keys, causal), gather) in enumerate(zip(meta.passes, gathers)))
    return PreparedPrefill(out_shape, out.dtype, meta.queries.cu_seqlens, planned)


def _plan_pass(meta: PrefillMetadata, keys: KeyRows, causal: bool, merge: bool, gather: Gather,
               scratch: torch.Tensor | None, rows: torch.Tensor, q: torch.Tensor, kv_b_weight: torch.Tensor,
               out: torch.Tensor, lse: torch.Tensor) -> _Pass | _HeldPass:
    """One pass planned on unwritten tensors of its gather's result layout (nothing is computed)."""
    def attention(k_nope, k_pe, v):
        return plan_attention(q, k_nope, k_pe, v, meta.queries.cu_seqlens, keys.segments.cu_seqlens, out, lse,
                              max_q_len=meta.queries.max_len, causal=causal, merge=merge,
                              max_k_len=keys.segments.max_len)

    if isinstance(gather, TorchGather):
        sample = gather.sample(rows, keys.slots, kv_b_weight)
        return _Pass(keys.slots, keys.segments.cu_seqlens, gather, attention(*sample))
    buffer = scratch[: gather.m * gather.width].view(gather.m, gather.width)
    attend = attention(*gather.views(buffer))
    if hasattr(attend, "launch_descriptors"):
        return _HeldPass(keys.slots, keys.segments.cu_seqlens, gather, buffer,
                         attend.key_descriptors(*gather.matrices(buffer)), attend.launch_descriptors)
    return _HeldPass(keys.slots, keys.segments.cu_seqlens, gather, buffer, gather.views(buffer), attend)


def _scratch(gathers: tuple[Gather, ...], device: torch.device) -> torch.Tensor | None:
    """One buffer for every fused gather of a prepared call, as large as the largest (the passes run one after
    another, each attention before the next gather); None where torch gathers every pass."""
    held = [gather for gather in gathers if isinstance(gather, gather_decompress.GatherLaunch)]
    if not held:
        return None
    return torch.empty(max(gather.m * gather.width for gather in held), dtype=held[0].dtype, device=device)
