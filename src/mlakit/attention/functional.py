"""The functional entry points shared by every backend: `mla_decode`, `mla_extend` and `mla_prefill`."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Literal

import torch

from mlakit.attention.checks import (
    check_cache_operand,
    check_decode_inputs,
    check_extend_inputs,
    check_metadata_arguments,
    check_output,
    check_prefill_inputs,
    checked_softmax_scale,
)
from mlakit.config import AUTO
from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError, MLAInputError, checked_kv_tokens_hint, checked_page_size_hint
from mlakit.cache.kv_quant import STORAGE_DTYPES, storage_name
from mlakit.prefill.metadata import PrefillMetadata
from mlakit.prefill.mha import head_dims
from mlakit.reference import pages_view
from mlakit.registry.catalog import all_records, get_backend, runnable_problems
from mlakit.registry.records import BackendRecord
from mlakit.registry.fit import Requirements
from mlakit.shape import MLAShape

# Latent widths of the published MLA models: cache dim -> kv_lora_rank.
_KNOWN_LATENT_SPLITS = {576: 512, 288: 256}


@dataclasses.dataclass(frozen=True)
class DecodeMetadata:
    """A backend's per-step decode metadata: build it once per step with `mla_decode_metadata`
    and pass it to every layer's `mla_decode` (as FlashMLA's `get_mla_metadata`)."""

    backend: str
    batch: int
    q_len: int
    heads: int
    kv_cache_dtype: str
    data: object
    # Calls prepared by the backend for each input layout seen with check_inputs=False, with their default scale.
    calls: dict[tuple, tuple[Callable[..., tuple], float]] = dataclasses.field(
        default_factory=dict, init=False, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class ExtendMetadata:
    """A backend's per-step extend metadata, from `mla_extend_metadata`, for every layer's `mla_extend`
    over the same `cu_seqlens_q` (kept, with a copy of its offsets as planned)."""

    backend: str
    max_q_len: int
    heads: int
    kv_cache_dtype: str
    cu_seqlens_q: torch.Tensor
    planned_offsets: torch.Tensor
    data: object
    # As DecodeMetadata.calls (layouts include cu_seqlens_q's address: the one tensor the metadata serves).
    calls: dict[tuple, tuple[Callable[..., tuple], float]] = dataclasses.field(
        default_factory=dict, init=False, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class _ResolvedCall:
    """What a checked call layout resolves to: the backend that runs it and the latent split."""

    backend: str
    kv_lora_rank: int
    cache_dtype: str
    default_scale: float


# Call layouts already checked and resolved (dropped all at once when full).
MAX_LAYOUTS = 1024
_RESOLVED: dict[tuple, _ResolvedCall] = {}


def mla_decode_metadata(
    cache_seqlens: torch.Tensor, *, q_len: int, heads: int, backend: str, kv_cache_dtype: str = "bf16",
    kv_tokens_hint: int | None = None, page_size: int | None = None,
) -> DecodeMetadata:
    """What `backend` computes once per decode step from the lengths alone (the triton backend's
    split plan: one small launch, no host sync), for reuse by every layer. `kv_cache_dtype`
    ("bf16", "fp16" or "fp8_e4m3", as FlashMLA's `is_fp8_kvcache`) is the cache's storage
    dtype: the kernel, hence the plan, depends on it. The triton backend's plan only balances
    the work: a call whose lengths have changed since (a sequence grew) still reads every token.
    `kv_tokens_hint`: the sum of `cache_seqlens` where the caller knows it on the host (an engine's running total,
    e.g. SGLang's `seq_lens_sum`); it lets a backend pick tiles that pay only on large batches (the triton_fp8
    backend's 32-row tile for 17-32 query rows a sequence) and kernel variants that pay only on long sequences (the
    triton backend's Hopper kernel at 256 query rows a sequence or more turns one off for short ones); without it the
    choice stays the safe one, or the one for long sequences. `page_size`:
    the cache's tokens per page, where the caller knows it when it plans; it lets a backend choose plans that suit
    only some caches' kernels (the triton backend's equal shares, which its persistent Hopper kernel runs well and
    the others slowly): pass `mlakit.decode_page_size_hint(kv_cache, kv_scale, kv_lora_rank)`, which leaves it out
    where that kernel does not read the cache (fp8 with per-group scales, pages that are not whole 64-token tiles,
    latents it does not take).
    Neither hint is checked against the calls: a wrong one costs speed, never correctness.

    >>> md = mla_decode_metadata(torch.tensor([20, 3], dtype=torch.int32), q_len=1, heads=4, backend="reference")
    >>> md.backend, md.kv_cache_dtype, md.data is None
    ('reference', 'bf16', True)
    """
    check_metadata_arguments(cache_seqlens, heads, "q_len", q_len)
    _check_storage_name(kv_cache_dtype)
    builder = get_backend(backend).decode_metadata
    hint = _hint_arguments(kv_tokens_hint, page_size)
    data = None if builder is None else builder(cache_seqlens, q_len=q_len, heads=heads, kv_cache_dtype=kv_cache_dtype,
                                                **hint)
    return DecodeMetadata(backend, cache_seqlens.shape[0], q_len, heads, kv_cache_dtype, data)


def mla_extend_metadata(
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    max_q_len: int,
    heads: int,
    backend: str,
    kv_cache_dtype: str = "bf16",
    kv_tokens_hint: int | None = None,
    page_size: int | None = None,
) -> ExtendMetadata:
    """What `backend` computes once per extend step from the lengths and the new tokens' offsets
    (the triton backend's split plan, no host sync), for every layer's `mla_extend`. The plan
    reads `cu_seqlens_q`'s values now: calls must pass this same tensor with the same values
    (as FlashInfer's `plan`); `mla_extend` refuses another tensor and, with `check_inputs=True`,
    changed values. `kv_tokens_hint` and `page_size` as `mla_decode_metadata`'s.

    >>> md = mla_extend_metadata(torch.tensor([20, 3], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32),
    ...     max_q_len=2, heads=4, backend="reference")
    >>> md.backend, md.max_q_len, md.data is None
    ('reference', 2, True)
    """
    check_metadata_arguments(cache_seqlens, heads, "max_q_len", max_q_len, cu_seqlens_q)
    _check_storage_name(kv_cache_dtype)
    builder = get_backend(backend).extend_metadata
    hint = _hint_arguments(kv_tokens_hint, page_size)
    data = None if builder is None else builder(cache_seqlens, cu_seqlens_q, max_q_len=max_q_len, heads=heads,
                                                kv_cache_dtype=kv_cache_dtype, **hint)
    return ExtendMetadata(backend, max_q_len, heads, kv_cache_dtype, cu_seqlens_q, cu_seqlens_q.clone(), data)


def backend_for(
    call: Literal["decode", "extend"], q: torch.Tensor, kv_cache: torch.Tensor, *, backend: str = AUTO,
    kv_lora_rank: int | None = None, return_lse: bool = False,
) -> str:
    """The backend `mla_decode` (`call` "decode", q `[batch, q_len, heads, dim]`) or `mla_extend` ("extend", q
    `[tokens, heads, dim]`; it always returns lse) runs these arguments on: `backend` where it names one, else the
    registry's choice for q's device, shape and the cache, i.e. the backend whose `mla_decode_metadata` /
    `mla_extend_metadata` a call with `backend="auto"` takes.

    >>> q = torch.randn(2, 1, 4, 576, dtype=torch.bfloat16)
    >>> backend_for("decode", q, torch.randn(8, 16, 576, dtype=torch.bfloat16))
    'reference'
    """
    if call not in ("decode", "extend"):
        raise MLAInputError(f"call: expected 'decode' or 'extend', got {call!r}")
    decode = call == "decode"
    dim = _query_width(q, 4 if decode else 3, "[batch, q_len, heads, dim]" if decode else "[tokens, heads, dim]")
    kv_lora_rank = _latent_rank(dim, kv_lora_rank)
    check_cache_operand(q, kv_cache, kv_lora_rank)
    return _resolved_call(call, backend, q, kv_cache, q.shape[1] if decode else 1, kv_lora_rank,
                          bool(return_lse) or not decode).backend


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    backend: str = AUTO,
    kv_scale: torch.Tensor | None = None,
    kv_lora_rank: int | None = None,
    return_lse: bool = True,
    check_inputs: bool = True,
    metadata: DecodeMetadata | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MLA decode over a paged latent cache on the chosen backend.

    Shapes: q `[batch, q_len, heads, kv_lora_rank + rope]` (bf16/fp16); kv_cache
    `[num_pages, page_size, kv_lora_rank + rope]` (or with a `[.., 1, ..]` head axis;
    bf16, fp16 or fp8_e4m3 with `kv_scale`); block_table `[batch, max_pages]` int32;
    cache_seqlens `[batch]` int32. Returns out `[batch, q_len, heads, kv_lora_rank]` in
    q's dtype and lse `[batch, heads, q_len]` float32 (natural log), or None for lse when
    `return_lse=False`. With q_len > 1, query i of a length-L sequence sees keys
    `0 .. L - q_len + i`. `out` and `lse` of those shapes receive the results when given
    (out's last dim contiguous, lse at any strides; as FlashInfer's `run(out=, lse=)`).

    `softmax_scale` defaults to `1/sqrt(q.shape[-1])` (FlashMLA's default); pass the
    model's `MLAShape.softmax_scale`. It must be a finite number > 0 (NaN, inf, 0 and negative
    scales raise MLAInputError). `kv_lora_rank` defaults to 512 for 576-wide rows
    and 256 for 288-wide rows. `metadata` (from `mla_decode_metadata`, for the same lengths)
    saves rebuilding the backend's per-step metadata in every layer.

    Shape, dtype and device are always checked (once per layout of the arguments: a repeated
    layout reuses the verdict and the backend choice). `check_inputs=True` also reads the lengths
    and page indices, which costs a host sync: 0.25-0.39 ms of host time a call on the H100
    machine, against 0.02-0.03 ms with `check_inputs=False`, `metadata=` and `out=` (`mlakit bench
    overhead`); pass `check_inputs=False` in serving steps and inside CUDA-graph capture.

    >>> q = torch.randn(2, 1, 4, 576, dtype=torch.bfloat16)
    >>> cache = torch.randn(8, 16, 576, dtype=torch.bfloat16)
    >>> table = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32)
    >>> out, lse = mla_decode(q, cache, table, torch.tensor([20, 3], dtype=torch.int32), softmax_scale=192**-0.5)
    >>> out.shape, lse.shape
    (torch.Size([2, 1, 4, 512]), torch.Size([2, 4, 1]))
    """
    layout = _layout(q, kv_cache, block_table, cache_seqlens, kv_scale, out, lse, kv_lora_rank, backend, return_lse, 4)
    prepared = _prepared(metadata, layout, check_inputs, softmax_scale)
    if prepared is not None:
        run, scale = prepared
        return run(q, kv_cache, block_table, cache_seqlens, kv_scale, scale, out, lse)
    call = _resolved(layout)
    if call is None or check_inputs:
        call = _resolve_decode(q, kv_cache, block_table, cache_seqlens, kv_scale, kv_lora_rank, backend, return_lse,
                               out, lse, check_inputs)
        _remember(layout, call)
    scale = checked_softmax_scale(softmax_scale, default=call.default_scale)
    entry = get_backend(call.backend)
    extra = {}
    if metadata is not None:
        _check_decode_metadata(metadata, call, q)
        if entry.decode_metadata is not None:
            extra["metadata"] = metadata.data
    written_out, written_lse = _run_into(
        entry, entry.decode, out, lse, q, kv_cache, block_table, cache_seqlens,
        kv_lora_rank=call.kv_lora_rank, softmax_scale=scale, kv_scale=kv_scale, **extra,
    )
    _prepare(entry, metadata, layout, check_inputs, call, q, kv_cache, block_table, cache_seqlens, kv_scale,
             bool(return_lse), out, lse)
    return written_out, (written_lse if return_lse else None)


def mla_extend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    max_q_len: int,
    softmax_scale: float | None = None,
    backend: str = AUTO,
    kv_scale: torch.Tensor | None = None,
    kv_lora_rank: int | None = None,
    check_inputs: bool = True,
    metadata: ExtendMetadata | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent-form extend: ragged segments of new tokens attend to their sequence's cache.

    q is packed `[tokens, heads, kv_lora_rank + rope]` (bf16/fp16); sequence b's new tokens are
    `q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]` (int32 `[batch + 1]`, each segment at most
    `max_q_len`, a number the host knows), already written to the cache: new token i of a
    sequence of length L with n new tokens sees keys `0 .. L - n + i`. Returns out `[tokens,
    heads, kv_lora_rank]` in q's dtype and lse `[tokens, heads]` float32 (natural log), written
    into `out` and `lse` when given. `metadata` (from `mla_extend_metadata` over this
    `cu_seqlens_q`) saves planning the split in every layer. Other arguments as in `mla_decode`;
    `check_inputs=False` skips the checks that read values.

    >>> q = torch.randn(3, 4, 576, dtype=torch.bfloat16)
    >>> cache = torch.randn(8, 16, 576, dtype=torch.bfloat16)
    >>> out, lse = mla_extend(q, cache, torch.tensor([[0, 1], [5, 2]], dtype=torch.int32),
    ...     torch.tensor([20, 3], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32), max_q_len=2)
    >>> out.shape, lse.shape
    (torch.Size([3, 4, 512]), torch.Size([3, 4]))
    """
    layout = _layout(q, kv_cache, block_table, cache_seqlens, kv_scale, out, lse, kv_lora_rank, backend,
                     (_tensor_layout(cu_seqlens_q), cu_seqlens_q.data_ptr(), max_q_len, type(max_q_len))
                     if isinstance(cu_seqlens_q, torch.Tensor) else None, 3)
    prepared = _prepared(metadata, layout, check_inputs, softmax_scale)
    if prepared is not None:
        run, scale = prepared
        return run(q, kv_cache, block_table, cache_seqlens, kv_scale, scale, out, lse)
    call = _resolved(layout)
    if call is None or check_inputs:
        call = _resolve_extend(q, kv_cache, block_table, cache_seqlens, cu_seqlens_q, max_q_len, kv_scale,
                               kv_lora_rank, backend, out, lse, check_inputs)
        _remember(layout, call)
    scale = checked_softmax_scale(softmax_scale, default=call.default_scale)
    entry = get_backend(call.backend)
    extra = {}
    if metadata is not None:
        _check_extend_metadata(metadata, call, q, cu_seqlens_q, max_q_len, check_inputs)
        if entry.extend_metadata is not None:
            extra["metadata"] = metadata.data
    result = _run_into(
        entry, entry.extend, out, lse, q, kv_cache, block_table, cache_seqlens, cu_seqlens_q,
        max_q_len=max_q_len, kv_lora_rank=call.kv_lora_rank, softmax_scale=scale, kv_scale=kv_scale, **extra,
    )
    _prepare(entry, metadata, layout, check_inputs, call, q, kv_cache, block_table, cache_seqlens, kv_scale, True, out, lse)
    return result


def _layout(q, kv_cache, block_table, cache_seqlens, kv_scale, out, lse, kv_lora_rank, backend, rest, dims) -> tuple | None:
    """The call's layout: each tensor's shape, strides, dtype, device and whether its address is 16-byte
    aligned, and the other arguments that the structural checks, the backend choice and a prepared
    launch depend on; None when an argument is not a tensor."""
    try:
        return (
            dims, *_tensor_layout(q), *_tensor_layout(kv_cache), *_tensor_layout(block_table),
            *_tensor_layout(cache_seqlens), None if kv_scale is None else _tensor_layout(kv_scale),
            None if out is None else _tensor_layout(out), None if lse is None else _tensor_layout(lse),
            kv_lora_rank, type(kv_lora_rank), backend if isinstance(backend, str) else id(backend), rest,
        )
    except (AttributeError, TypeError):
        return None


def _tensor_layout(tensor: torch.Tensor) -> tuple:
    return tensor.shape, tensor.stride(), tensor.dtype, tensor.device, tensor.data_ptr() % 16


def _resolved(layout: tuple | None) -> _ResolvedCall | None:
    return _lookup(_RESOLVED, layout)


def _lookup(memo: dict, layout: tuple | None) -> object:
    """`memo[layout]`, or None where there is none or the layout holds an unhashable argument (the checks
    will name it)."""
    try:
        return memo.get(layout)
    except TypeError:
        return None


def _prepared(metadata: object, layout: tuple | None, check_inputs: object,
              softmax_scale: object) -> tuple[Callable[..., tuple], float] | None:
    """The call `metadata`'s backend prepared for this layout and the scale to run it with, when the call may
    take it: no value checks asked, and a scale that needs no check (None, or a finite float > 0)."""
    calls = getattr(metadata, "calls", None)
    if calls is None or check_inputs:
        return None
    found = _lookup(calls, layout)
    if found is None:
        return None
    run, default_scale = found
    if softmax_scale is None:
        return run, default_scale
    return (run, softmax_scale) if type(softmax_scale) is float and 0 < softmax_scale < math.inf else None


def _prepare(entry, metadata, layout, check_inputs, call, q, kv_cache, block_table, cache_seqlens, kv_scale, return_lse,
             out, lse) -> None:
    """After a checked call with the step's metadata and check_inputs=False: the backend's call prepared for
    this layout, kept in the metadata, so that the next call of the layout goes straight to its launches."""
    if metadata is None or check_inputs or layout is None or entry.prepare_call is None:
        return
    run = entry.prepare_call(metadata.data, q, kv_cache, block_table, cache_seqlens, kv_scale,
                             kv_lora_rank=call.kv_lora_rank, return_lse=return_lse, out=out, lse=lse)
    if run is not None:
        _keep(metadata.calls, layout, (run, call.default_scale))


def _remember(layout: tuple | None, call: _ResolvedCall) -> None:
    if layout is not None:
        _keep(_RESOLVED, layout, call)


def _keep(memo: dict, key: tuple, value: object) -> None:
    """`memo[key] = value`, dropping everything first when the memo is full."""
    if len(memo) >= MAX_LAYOUTS:
        memo.clear()
    memo[key] = value


def _resolve_decode(q, kv_cache, block_table, cache_seqlens, kv_scale, kv_lora_rank, backend, return_lse, out, lse,
                    check_values: bool) -> _ResolvedCall:
    """Every structural check of an `mla_decode` call (and the value checks with `check_values`), and
    the backend that serves it."""
    dim = _query_width(q, 4, "[batch, q_len, heads, dim]")
    kv_lora_rank = _latent_rank(dim, kv_lora_rank)
    check_decode_inputs(q, kv_cache, block_table, cache_seqlens, kv_scale, kv_lora_rank, check_values=check_values)
    batch, q_len, heads, _ = q.shape
    check_output("out", out, (batch, q_len, heads, kv_lora_rank), q.dtype, q.device, mergeable=q_len)
    check_output("lse", lse, (batch, heads, q_len), torch.float32, q.device, any_strides=True)
    return _resolved_call("decode", backend, q, kv_cache, q_len, kv_lora_rank, bool(return_lse))


def _resolve_extend(q, kv_cache, block_table, cache_seqlens, cu_seqlens_q, max_q_len, kv_scale, kv_lora_rank, backend,
                    out, lse, check_values: bool) -> _ResolvedCall:
    """`_resolve_decode` for an `mla_extend` call."""
    dim = _query_width(q, 3, "[tokens, heads, dim]")
    kv_lora_rank = _latent_rank(dim, kv_lora_rank)
    check_extend_inputs(q, kv_cache, block_table, cache_seqlens, cu_seqlens_q, max_q_len, kv_scale, kv_lora_rank,
                        check_values=check_values)
    tokens, heads, _ = q.shape
    check_output("out", out, (tokens, heads, kv_lora_rank), q.dtype, q.device)
    check_output("lse", lse, (tokens, heads), torch.float32, q.device, any_strides=True)
    return _resolved_call("extend", backend, q, kv_cache, 1, kv_lora_rank, True)


def _resolved_call(call: Literal["decode", "extend", "prefill"], backend: object, q: torch.Tensor,
                   kv_cache: torch.Tensor, q_len: int, kv_lora_rank: int, needs_lse: bool,
                   head_widths: tuple[int, int] = (1, 1)) -> _ResolvedCall:
    """The backend serving a checked call (q `[..., heads, width]`), with the latent split, cache dtype and
    default scale it runs with; `head_widths` (d_nope, d_v) where the call shows them (a prefill)."""
    pages = pages_view(kv_cache)
    cache_dtype = storage_name(pages.dtype)
    name = _backend_for(call, _checked_backend(backend), str(q.device), cache_dtype, pages.shape[1], q_len, q.shape[-2],
                        kv_lora_rank, pages.shape[-1] - kv_lora_rank, needs_lse, *head_widths)
    return _ResolvedCall(name, kv_lora_rank, cache_dtype, q.shape[-1] ** -0.5)


def _check_decode_metadata(metadata: object, call: _ResolvedCall, q: torch.Tensor) -> None:
    if not isinstance(metadata, DecodeMetadata):
        raise MLAInputError(f"metadata: expected a DecodeMetadata from mla_decode_metadata, got {type(metadata).__name__}")
    if (metadata.backend, metadata.batch, metadata.q_len, metadata.heads, metadata.kv_cache_dtype) != (
        call.backend, *q.shape[:3], call.cache_dtype
    ):
        raise MLAInputError(
            f"metadata: built for backend {metadata.backend!r}, batch {metadata.batch}, q_len {metadata.q_len}, "
            f"{metadata.heads} heads, a {metadata.kv_cache_dtype} cache; this call runs on {call.backend!r} with batch "
            f"{q.shape[0]}, q_len {q.shape[1]}, {q.shape[2]} heads, a {call.cache_dtype} cache"
        )


def _check_extend_metadata(metadata: object, call: _ResolvedCall, q: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           max_q_len: int, check_values: bool) -> None:
    if not isinstance(metadata, ExtendMetadata):
        raise MLAInputError(f"metadata: expected an ExtendMetadata from mla_extend_metadata, got {type(metadata).__name__}")
    if (metadata.backend, metadata.max_q_len, metadata.heads, metadata.kv_cache_dtype) != (
        call.backend, max_q_len, q.shape[1], call.cache_dtype
    ):
        raise MLAInputError(
            f"metadata: built for backend {metadata.backend!r}, max_q_len {metadata.max_q_len}, {metadata.heads} heads, "
            f"a {metadata.kv_cache_dtype} cache; this call runs on {call.backend!r} with max_q_len {max_q_len}, "
            f"{q.shape[1]} heads, a {call.cache_dtype} cache"
        )
    planned = metadata.cu_seqlens_q
    if planned.data_ptr() != cu_seqlens_q.data_ptr() or planned.shape != cu_seqlens_q.shape:
        raise MLAInputError("cu_seqlens_q: expected the tensor the extend metadata was planned from (build the metadata "
                            "from this call's cu_seqlens_q), got another tensor")
    if check_values and not torch.equal(metadata.planned_offsets, cu_seqlens_q):
        raise MLAInputError(f"cu_seqlens_q: expected the offsets the extend metadata was planned from "
                            f"{metadata.planned_offsets.tolist()} (rebuild it after changing them), got {cu_seqlens_q.tolist()}")


def _run_into(entry, kernel, out, lse, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """`kernel(*args, **kwargs)` with its results in `out` and `lse` where given: written there by a
    backend that `writes_outputs`, copied there for the others."""
    if entry.writes_outputs:
        return kernel(*args, out=out, lse=lse, **kwargs)
    return _copied_into(out, lse, *kernel(*args, **kwargs))


def _copied_into(out: torch.Tensor | None, lse: torch.Tensor | None, result_out: torch.Tensor,
                 result_lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A kernel's results, copied into `out` and `lse` where those are given."""
    if out is not None:
        out.copy_(result_out)
        result_out = out
    if lse is not None and result_lse is not None:
        lse.copy_(result_lse)
        result_lse = lse
    return result_out, result_lse


def _check_storage_name(kv_cache_dtype: object) -> None:
    if kv_cache_dtype not in STORAGE_DTYPES:
        raise MLAInputError(f"kv_cache_dtype: expected one of {sorted(STORAGE_DTYPES)}, got {kv_cache_dtype!r}")


def _hint_arguments(kv_tokens_hint: object, page_size: object) -> dict[str, int]:
    """A metadata builder's keywords for the hints: the checked hints that were given (a hint not given is left out,
    so a builder written before its keyword still serves steps without it)."""
    hints = {"kv_tokens_hint": checked_kv_tokens_hint(kv_tokens_hint), "page_size": checked_page_size_hint(page_size)}
    return {name: value for name, value in hints.items() if value is not None}


def mla_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_b_weight: torch.Tensor,
    meta: PrefillMetadata,
    *,
    softmax_scale: float,
    backend: str = AUTO,
    kv_scale: torch.Tensor | None = None,
    check_inputs: bool = True,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MHA-form prefill: packed new tokens `q [T, heads, d_nope + d_rope]` (bf16/fp16, rope applied)
    attend causally to their sequence's cache, whose rows are decompressed per head through
    `kv_b_weight [heads * (d_nope + d_v), kv_lora_rank]` (`kv_b_proj.weight`).

    `meta` comes from `plan_prefill` (once per step, shared by every layer): it says which
    cache rows each pass reads and cuts long prefixes into bounded chunks. The new tokens
    must already be in the cache. Returns out `[T, heads, d_v]` in q's dtype and lse `[T,
    heads]` float32 (natural log), written into `out` / `lse` where given (preallocated by the
    caller, as engines do: tensors of those shapes and dtypes on q's device, last dims contiguous).

    `check_inputs=False` skips the one check that reads values (every page index in range), which
    costs a host sync; the triton backend then also keeps the call prepared in `meta` for the
    inputs' layout (`mlakit.prefill.prepared`: tiles, launch keys and grids of every pass worked out
    once), so later layers' calls only launch (and allocate the outputs not given). The prepared call
    holds its gathers' buffer, so the calls of one `meta` must run one after another on one stream,
    as layers do. Calls inside CUDA-graph capture run unprepared (capture them after an eager call,
    or let the graph hold their launches).

    >>> from mlakit.prefill.metadata import plan_prefill
    >>> cache = torch.randn(4, 16, 576, dtype=torch.bfloat16)
    >>> meta = plan_prefill([5], [20], torch.tensor([[3, 1]], dtype=torch.int32), page_size=16)
    >>> out, lse = mla_prefill(torch.randn(5, 2, 192, dtype=torch.bfloat16), cache,
    ...     torch.randn(2 * 256, 512, dtype=torch.bfloat16), meta, softmax_scale=192**-0.5)
    >>> out.shape, lse.shape
    (torch.Size([5, 2, 128]), torch.Size([5, 2]))
    """
    layout = None
    if not check_inputs and isinstance(meta, PrefillMetadata):
        try:
            layout = ("prefill", *_tensor_layout(q), *_tensor_layout(kv_cache), *_tensor_layout(kv_b_weight),
                      None if kv_scale is None else _tensor_layout(kv_scale),
                      None if out is None else _tensor_layout(out), None if lse is None else _tensor_layout(lse),
                      meta.queries.total, meta.page_size, meta.queries.cu_seqlens.device,
                      backend if isinstance(backend, str) else id(backend))
        except (AttributeError, TypeError):
            layout = None
    scale = checked_softmax_scale(softmax_scale)
    prepared = _lookup(meta.calls, layout) if layout is not None else None
    if prepared is not None:
        return prepared(q, kv_cache, kv_b_weight, kv_scale, scale, out, lse)
    call = _resolved(layout)
    if call is None:
        check_prefill_inputs(q, kv_cache, kv_b_weight, meta, kv_scale, out=out, lse=lse, check_values=check_inputs)
        call = _resolved_call("prefill", backend, q, kv_cache, 1, kv_b_weight.shape[1], True,
                              head_dims(q, pages_view(kv_cache).shape[-1], kv_b_weight))
        _remember(layout, call)
    entry = get_backend(call.backend)
    assert entry.prefill is not None  # _backend_for only returns backends with a prefill kernel
    if layout is not None and entry.prepare_prefill is not None:
        run = entry.prepare_prefill(meta, q, kv_cache, kv_b_weight, kv_scale, out, lse)
        if run is not None:
            _keep(meta.calls, layout, run)
            return run(q, kv_cache, kv_b_weight, kv_scale, scale, out, lse)
    return _copied_into(out, lse, *entry.prefill(q, kv_cache, kv_b_weight, meta, softmax_scale=scale, kv_scale=kv_scale))


def _query_width(q: object, dims: int, layout: str) -> int:
    """q's last dim (latent + rope), once q is a bf16 or fp16 tensor of `dims` dimensions."""
    if not isinstance(q, torch.Tensor) or q.dim() != dims:
        raise MLAInputError(f"q: expected a {dims}-dimensional tensor {layout}, got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise MLAInputError(f"q: expected dtype bfloat16 or float16, got {q.dtype}")
    return q.shape[-1]


def _checked_backend(backend: object) -> str:
    if not isinstance(backend, str):
        raise MLAInputError(f"backend: expected a registered backend name or {AUTO!r}, got {backend!r}")
    return backend


def _latent_rank(dim: int, kv_lora_rank: int | None) -> int:
    if kv_lora_rank is not None:
        return kv_lora_rank
    if dim not in _KNOWN_LATENT_SPLITS:
        raise MLAInputError(
            f"kv_lora_rank: cannot infer it from q's last dim {dim} (known: {_KNOWN_LATENT_SPLITS}); pass kv_lora_rank="
        )
    return _KNOWN_LATENT_SPLITS[dim]


@functools.lru_cache(maxsize=256)
def _backend_for(
    call: Literal["decode", "extend", "prefill"],
    backend: str,
    device: str,
    kv_dtype: str,
    page_size: int,
    q_len: int,
    heads: int,
    kv_lora_rank: int,
    rope_dim: int,
    needs_lse: bool,
    nope_dim: int = 1,
    v_dim: int = 1,
) -> str:
    """The backend that serves one kind of call (cached: the answer depends only on these)."""
    req = Requirements(
        device=DeviceInfo.detect(device),
        shape=MLAShape.of_latent(heads, kv_lora_rank, rope_dim, nope_dim, v_dim),
        page_size=page_size,
        kv_dtype=kv_dtype,
        decode_q_len=q_len,
        needs_lse=needs_lse,
    )

    def problems(record: BackendRecord) -> list[str]:
        found = runnable_problems(record, "prefill" if call == "prefill" else "decode", req)
        if call == "extend" and not record.latent_extend:
            found.append("has no latent-form extend kernel")
        return found

    if backend != AUTO:
        req = dataclasses.replace(req, named=True)
        refusals = problems(get_backend(backend).record)
        if refusals:
            raise ConfigError(f"backend {backend!r} cannot run this {call} call: " + "; ".join(refusals))
        return backend
    for record in all_records():
        if not problems(record):
            return record.name
    raise ConfigError(f"no registered backend can run this {call} call on {device}")
