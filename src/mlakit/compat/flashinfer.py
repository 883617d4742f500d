"""FlashInfer's MLA paged-attention wrapper on mlakit's kernels: swap the import, keep the call sites.

    from mlakit.compat.flashinfer import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

`BatchMLAPagedAttentionWrapper` takes FlashInfer 0.7.2's constructor, `plan()` (the flat CSR
form `plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
page_size, causal, sm_scale, q_data_type, kv_data_type)`, the flat dense form and the canonical
`metadata=MLAPlanMetadata.csr(...) / .dense(...)` form) and `run()` (the old
`run(q_nope, q_pe, ckv_cache, kpe_cache, out=, lse=, return_lse=)` form and the new
`run(query=, kv_cache=)` form), and returns what FlashInfer returns: out `[total_q, heads,
head_dim_ckv]` in the query's dtype and, when asked, lse `[total_q, heads]` float32 in base 2
(natural log with `return_lse_base_on_e=True`). The work runs on mlakit's `triton` backend when
the workspace buffer is on a CUDA device and on the `reference` backend elsewhere, never on
FlashInfer itself; FlashInfer's kernel names (`backend="fa2"`, ...) are accepted and mean
"mlakit's choice".

Beyond FlashInfer: any page size, any head count, any latent and rope widths, any number of
query tokens per request (causal: a request's query tokens are its last ones in the cache, so
query i of n sees keys `0 .. kv_len - n + i`), fp16 or bf16 queries over fp8-e4m3 caches on any
GPU Triton runs fp8 on (scales `ckv_scale` / `kpe_scale`, or mlakit's `kv_scale=` tensor:
`[1]` per tensor or `[num_pages, page_size, groups]` per 128-column group).

The cache must be one `[num_pages, page_size, head_dim_ckv + head_dim_kpe]` buffer: pass it as
`kv_cache=`, or pass `ckv_cache` / `kpe_cache` as views of its two column ranges. Two separate
allocations raise MLAInputError (mlakit's kernels read one row per token; joining them would
copy the whole cache on every call). Options mlakit does not implement (profiler, sinks,
skip-softmax, output scales, bmm scales, per-token `ckv_scale_arr`, CUTLASS `kv_len` /
`page_table`) raise MLAInputError naming them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Iterator
from typing import Literal, NamedTuple

import torch

from mlakit.attention.checks import checked_softmax_scale
from mlakit.attention.functional import (
    DecodeMetadata,
    ExtendMetadata,
    mla_decode,
    mla_decode_metadata,
    mla_extend,
    mla_extend_metadata,
)
from mlakit.cache.kv_quant import FP8_DTYPE, SCALE_PER_GROUP, SCALE_PER_TENSOR, storage_name
from mlakit.compat._arguments import describe, is_positive_int
from mlakit.errors import MLAInputError
from mlakit.kernels.seesaw_layout import layout_page_size_hint
from mlakit.prefill.metadata import upload, upload_ints

LOG2E = 1.4426950408889634
FLASHINFER_BACKENDS = frozenset(
    {"auto", "fa2", "fa3", "cutlass", "cutile", "trtllm-gen", "xqa", "cute-dsl", "cute-dsl-monolithic", "cute-dsl-modular"}
)
MLAKIT_BACKENDS = frozenset({"triton", "reference"})
_QUERY_DTYPES = (torch.bfloat16, torch.float16)
_CACHE_DTYPES = (torch.bfloat16, torch.float16, FP8_DTYPE)


@dataclasses.dataclass(frozen=True)
class MLAPlanMetadata:
    """One step's requests for `BatchMLAPagedAttentionWrapper.plan(metadata=...)`, as FlashInfer's
    class of that name: the CSR form (`csr`: query offsets, page offsets, flat page ids, lengths)
    or the dense form (`dense`: query offsets, a `[batch, max_pages]` page table, lengths). All
    tensors int32, on the CPU or the wrapper's device. FlashInfer's own instances work too.

    >>> md = MLAPlanMetadata.dense(torch.tensor([0, 1], dtype=torch.int32),
    ...     torch.tensor([[3]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32))
    >>> md.block_tables.shape, md.qo_indptr is None
    (torch.Size([1, 1]), True)
    """

    qo_indptr: torch.Tensor | None = None
    kv_indptr: torch.Tensor | None = None
    kv_indices: torch.Tensor | None = None
    kv_len_arr: torch.Tensor | None = None
    cum_seq_lens_q: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    max_q_len: int | None = None

    @classmethod
    def csr(
        cls, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_len_arr: torch.Tensor
    ) -> MLAPlanMetadata:
        """Request b's query tokens are `qo_indptr[b]:qo_indptr[b+1]`, its pages
        `kv_indices[kv_indptr[b]:kv_indptr[b+1]]` and its cached tokens `kv_len_arr[b]`.

        >>> as_int32 = lambda values: torch.tensor(values, dtype=torch.int32)
        >>> MLAPlanMetadata.csr(as_int32([0, 1, 3]), as_int32([0, 2, 3]), as_int32([7, 4, 1]), as_int32([90, 5])).kv_indices
        tensor([7, 4, 1], dtype=torch.int32)
        """
        return cls(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)

    @classmethod
    def dense(
        cls, cum_seq_lens_q: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_q_len: int | None = None
    ) -> MLAPlanMetadata:
        """Request b's query tokens are `cum_seq_lens_q[b]:cum_seq_lens_q[b+1]`, its pages the
        first entries of `block_tables[b]` and its cached tokens `seq_lens[b]`."""
        return cls(cum_seq_lens_q=cum_seq_lens_q, block_tables=block_tables, seq_lens=seq_lens, max_q_len=max_q_len)


@dataclasses.dataclass(frozen=True)
class PlannedStep:
    """What `plan()` made of a step, in mlakit's terms: the rows the kernels see (one per request,
    or one per query token for non-causal multi-token requests), their page table, lengths and
    (for ragged query lengths) query offsets, the decode metadata every layer reuses, and the
    facts `run()` checks its tensors against."""

    query_offsets: tuple[int, ...]
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    q_len: int
    cu_seqlens_q: torch.Tensor | None
    metadata: DecodeMetadata | ExtendMetadata
    largest_page: int

    def __post_init__(self) -> None:
        if isinstance(self.metadata, ExtendMetadata) != (self.cu_seqlens_q is not None):
            raise ValueError("a planned step runs either as a decode (decode metadata) or as an extend (cu_seqlens_q and "
                             "extend metadata)")

    @property
    def total_q(self) -> int:
        """Query tokens in the step (rows of `run()`'s query and output)."""
        return self.query_offsets[-1]

    @functools.cached_property
    def max_q_len(self) -> int:
        return max(b - a for a, b in zip(self.query_offsets, self.query_offsets[1:]))


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """The scalars of one `plan()` call, validated here: what every later `run()` must match."""

    num_heads: int
    head_dim_ckv: int
    head_dim_kpe: int
    page_size: int
    causal: bool
    sm_scale: float
    q_data_type: torch.dtype
    kv_data_type: torch.dtype
    kv_scale_layout: Literal["tensor", "group"] = "tensor"

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim_ckv", "head_dim_kpe", "page_size"):
            if not is_positive_int(getattr(self, name)):
                raise MLAInputError(f"{name}: expected an integer >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.causal, bool):
            raise MLAInputError(f"causal: expected True or False, got {self.causal!r}")
        try:
            object.__setattr__(self, "sm_scale", checked_softmax_scale(self.sm_scale))
        except MLAInputError as error:
            raise MLAInputError(f"sm_scale: {error}") from None
        if self.q_data_type not in _QUERY_DTYPES:
            raise MLAInputError(f"q_data_type: expected torch.bfloat16 or torch.float16, got {self.q_data_type!r}")
        if self.kv_data_type not in _CACHE_DTYPES:
            raise MLAInputError(
                f"kv_data_type: expected one of {[str(d) for d in _CACHE_DTYPES]}, got {self.kv_data_type!r}"
            )
        _check_choice("kv_scale_layout", self.kv_scale_layout, ("tensor", "group"))
        if self.kv_scale_layout == "group" and self.kv_data_type != FP8_DTYPE:
            raise MLAInputError(
                f"kv_scale_layout: 'group' declares per-group fp8 scales, got a {self.kv_data_type} cache"
            )

    @property
    def dim(self) -> int:
        return self.head_dim_ckv + self.head_dim_kpe


class BatchMLAPagedAttentionWrapper:
    """FlashInfer's `BatchMLAPagedAttentionWrapper` on mlakit's kernels: `plan()` once per step
    (host-side, as FlashInfer's), then `run()` per layer.

    `float_workspace_buffer` names the device (mlakit's kernels size their own scratch).
    `use_cuda_graph=True` needs the four int32 buffers `qo_indptr [batch + 1]`, `kv_indptr
    [batch + 1]`, `kv_indices [capacity]` and `kv_len_arr [batch]` on that device: every accepted
    plan writes its metadata into them and into mlakit's own fixed buffers (page table `[rows,
    max_pages_per_request]`, lengths, split plan), so a captured `run()` replays with the newest
    plan's lengths and pages. Re-plans must keep the first plan's configuration and query offsets
    (FlashInfer's plan() documents fixed query offsets for graph plans too); a refused plan leaves the
    buffers and the planned step as they were.
    `max_pages_per_request` (mlakit's extension, graph mode only) bounds the page table's width;
    it defaults to the `kv_indices` capacity. Without `use_cuda_graph` the buffers are ignored,
    as FlashInfer does.

    `backend`: FlashInfer's names are accepted and leave the choice to mlakit; "triton" or
    "reference" pick mlakit's backend (default: triton on CUDA, reference elsewhere).

    >>> wrapper = BatchMLAPagedAttentionWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    >>> wrapper.plan(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32),
    ...     torch.tensor([4, 0, 2], dtype=torch.int32), torch.tensor([20, 3], dtype=torch.int32),
    ...     8, 512, 64, 16, True, 192**-0.5, torch.bfloat16, torch.bfloat16)
    >>> cache = torch.randn(5, 16, 576, dtype=torch.bfloat16)
    >>> q = torch.randn(2, 8, 576, dtype=torch.bfloat16)
    >>> out, lse = wrapper.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], return_lse=True)
    >>> out.shape, lse.shape
    (torch.Size([2, 8, 512]), torch.Size([2, 8]))
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        backend: str = "auto",
        *,
        max_pages_per_request: int | None = None,
    ) -> None:
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise MLAInputError(f"float_workspace_buffer: expected a torch.Tensor, got {type(float_workspace_buffer).__name__}")
        self.device = float_workspace_buffer.device
        self._float_workspace_buffer = float_workspace_buffer
        self._backend = _mlakit_backend(backend, self.device)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._graph_buffers = (
            _GraphBuffers.of(self.device, qo_indptr, kv_indptr, kv_indices, kv_len_arr, max_pages_per_request)
            if self._use_cuda_graph
            else None
        )
        if max_pages_per_request is not None and not self._use_cuda_graph:
            raise MLAInputError("max_pages_per_request: only used with use_cuda_graph=True (it sizes the fixed page table)")
        self._config: PlanConfig | None = None
        self._step: PlannedStep | None = None
        self._run_layouts: dict[tuple, _RunLayout] = {}

    @property
    def backend(self) -> str:
        """The mlakit backend that runs this wrapper's calls ("triton" or "reference")."""
        return self._backend

    def plan(
        self,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        num_heads: int | None = None,
        head_dim_ckv: int | None = None,
        head_dim_kpe: int | None = None,
        page_size: int | None = None,
        causal: bool | None = None,
        sm_scale: float | None = None,
        q_data_type: torch.dtype | None = None,
        kv_data_type: torch.dtype | None = None,
        use_profiler: bool = False,
        *,
        metadata: MLAPlanMetadata | None = None,
        cum_seq_lens_q: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        max_q_len: int | None = None,
        query_layout: Literal["packed", "split"] | None = None,
        kv_cache_layout: Literal["packed", "split"] | None = None,
        lse_mode: Literal["none", "base2", "basee"] = "none",
        output_dtype: torch.dtype | None = None,
        output_scale: str = "none",
        scale_mode: str = "default",
        skip_softmax: bool = False,
        enable_pdl: bool | None = None,
        use_sinks: bool = False,
        kv_scale_layout: Literal["tensor", "group"] = "tensor",
    ) -> None:
        """Describes one step's requests (CSR, dense, or `metadata=`) and the attention every
        `run()` until the next plan computes. Host-side: it reads the offsets and lengths (a wait
        for the device only where they are device tensors), builds mlakit's page table and split plan on
        the device from pinned, non-blocking uploads, reads back the largest page id read (one sync)
        and checks every value so that `run()` never syncs. `query_layout`, `kv_cache_layout` and `lse_mode` only
        declare what `run()` will pass (both layouts are always accepted; `run()`'s
        `return_lse_base_on_e` picks the lse base); `enable_pdl` is a launch hint mlakit does
        not need. Refused (MLAInputError naming them): `use_profiler`, `skip_softmax`,
        `use_sinks`, an `output_scale`, an `output_dtype` other than `q_data_type`, and
        `scale_mode` other than "default" / "kv-per-tensor". mlakit's addition `kv_scale_layout`: "group" where
        the fp8 cache's `run(kv_scale=)` will be per-group scales; the plan then leaves out the equal shares that
        only a per-tensor scale's kernel runs well (a wrong value costs speed, never correctness; "group" is refused
        with a 16-bit cache or `scale_mode="kv-per-tensor"`).

        >>> wrapper = BatchMLAPagedAttentionWrapper(torch.empty(8, dtype=torch.uint8))
        >>> wrapper.plan(metadata=MLAPlanMetadata.dense(torch.tensor([0, 2], dtype=torch.int32),
        ...     torch.tensor([[1, 0]], dtype=torch.int32), torch.tensor([70], dtype=torch.int32)),
        ...     num_heads=4, head_dim_ckv=512, head_dim_kpe=64, page_size=64, causal=True,
        ...     sm_scale=0.07, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        >>> wrapper.run(query=torch.randn(2, 4, 576, dtype=torch.bfloat16),
        ...     kv_cache=torch.randn(2, 64, 576, dtype=torch.bfloat16)).shape
        torch.Size([2, 4, 512])
        """
        _refuse_given(use_profiler=use_profiler, skip_softmax=skip_softmax, use_sinks=use_sinks)
        _check_choice("query_layout", query_layout, (None, "packed", "split"))
        _check_choice("kv_cache_layout", kv_cache_layout, (None, "packed", "split"))
        _check_choice("lse_mode", lse_mode, ("none", "base2", "basee"))
        _check_choice("output_scale", output_scale, ("none",))
        _check_choice("scale_mode", scale_mode, ("default", "kv-per-tensor"))
        if scale_mode == "kv-per-tensor" and kv_scale_layout == "group":
            raise MLAInputError("kv_scale_layout: 'group' contradicts scale_mode='kv-per-tensor'")
        required = dict(num_heads=num_heads, head_dim_ckv=head_dim_ckv, head_dim_kpe=head_dim_kpe, page_size=page_size,
                        causal=causal, sm_scale=sm_scale, q_data_type=q_data_type, kv_data_type=kv_data_type)
        missing = [name for name, value in required.items() if value is None]
        if missing:
            raise MLAInputError(f"{', '.join(missing)}: required by plan(), got None")
        config = PlanConfig(**required, kv_scale_layout=kv_scale_layout)
        if output_dtype is not None and output_dtype != config.q_data_type:
            raise MLAInputError(f"output_dtype: expected None or q_data_type ({config.q_data_type}), got {output_dtype}")
        requests = _requests_from(
            metadata,
            MLAPlanMetadata(qo_indptr, kv_indptr, kv_indices, kv_len_arr, cum_seq_lens_q, block_tables, seq_lens, max_q_len),
            config.page_size,
            self.device,
        )
        step = _plan_step(requests, config, self._backend, _page_size_hint(config),
                          hint_tokens=self._graph_buffers is None)
        if self._graph_buffers is not None:
            step = self._graph_buffers.hold(step, requests, config)
        if self._step is None or (config, step.total_q, step.q_len) != (self._config, self._step.total_q, self._step.q_len):
            self._run_layouts = {}  # run()'s verdicts hold for one configuration and one shape of the rows
        self._config, self._step = config, step

    def run(
        self,
        q_nope: torch.Tensor | None = None,
        q_pe: torch.Tensor | None = None,
        ckv_cache: torch.Tensor | None = None,
        kpe_cache: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        profiler_buffer: torch.Tensor | None = None,
        kv_len: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        return_lse_base_on_e: bool = False,
        o_scale: float | None = None,
        *,
        query: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        ckv_scale: float | None = None,
        ckv_scale_arr: torch.Tensor | None = None,
        kpe_scale: float | None = None,
        sinks: torch.Tensor | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        bmm1_scale: float | None = None,
        bmm2_scale: float | None = None,
        kv_scale: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned step: returns out `[total_q, num_heads, head_dim_ckv]` in the
        query's dtype, or `(out, lse)` with `return_lse=True` (lse `[total_q, num_heads]` float32,
        base 2, natural log with `return_lse_base_on_e=True`; a query that sees no key gives zeros
        and -inf). `out=` / `lse=` are filled and returned; `lse=` is filled even without
        `return_lse`, as FlashInfer does. No host sync: capturable in a CUDA graph.

        The query is `query=` `[total_q, heads, ckv + kpe]` or `(q_nope, q_pe)` (joined without a
        copy when they are views of one buffer, else copied); the cache is `kv_cache=` `[num_pages,
        page_size, ckv + kpe]` or `(ckv_cache, kpe_cache)` views of one such buffer. fp8 caches
        take `ckv_scale` and `kpe_scale` (floats, stored value times scale) or mlakit's
        `kv_scale=` tensor.

        The tensors are checked against the plan in full on the first call of each layout (shapes,
        strides, dtypes, devices, and the parts' storage offsets) after a plan() that changed the
        configuration or the query rows; later calls of a known layout re-read only what a layout
        does not fix: that the two parts of a pair share their buffer, the cache's page count, the
        scales.

        >>> wrapper = BatchMLAPagedAttentionWrapper(torch.empty(8, dtype=torch.uint8))
        >>> wrapper.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
        ...     torch.tensor([0], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
        ...     2, 512, 64, 16, True, 0.07, torch.bfloat16, torch.bfloat16)
        >>> cache = torch.randn(1, 16, 576, dtype=torch.bfloat16)
        >>> out, lse = wrapper.run(query=torch.randn(1, 2, 576, dtype=torch.bfloat16), kv_cache=cache, return_lse=True)
        >>> out.abs().sum().item(), lse.tolist()
        (0.0, [[-inf, -inf]])
        """
        if not (
            profiler_buffer is None and kv_len is None and page_table is None and o_scale is None and ckv_scale_arr is None
            and sinks is None and skip_softmax_threshold_scale_factor is None and bmm1_scale is None and bmm2_scale is None
        ):
            _refuse_given(
                profiler_buffer=profiler_buffer, kv_len=kv_len, page_table=page_table, o_scale=o_scale,
                ckv_scale_arr=ckv_scale_arr, sinks=sinks, skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
                bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
            )
        if self._config is None or self._step is None:
            raise MLAInputError("run(): expected a plan() first, got none")
        tensors = _RunTensors(query, kv_cache, q_nope, q_pe, ckv_cache, kpe_cache, out, lse)
        key = tensors.layout_key(self.device)
        known = self._run_layouts.get(key)
        inputs = None if known is None else self._known_inputs(known, tensors, ckv_scale, kpe_scale, kv_scale)
        if inputs is None:
            inputs, known = self._checked_inputs(tensors, ckv_scale, kpe_scale, kv_scale)
            if key is not None and known is not None:
                if len(self._run_layouts) >= MAX_RUN_LAYOUTS:
                    self._run_layouts.clear()
                self._run_layouts[key] = known
        wants_lse = return_lse or lse is not None
        out, natural_lse = self._attend(*inputs, out, lse, wants_lse)
        if not wants_lse:
            return out
        lse = natural_lse if return_lse_base_on_e else natural_lse.mul_(LOG2E)
        return (out, lse) if return_lse else out

    def _checked_inputs(
        self, tensors: _RunTensors, ckv_scale: object, kpe_scale: object, kv_scale: torch.Tensor | None
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None], _RunLayout | None]:
        """The kernel's query, cache and kv_scale after every check of run()'s arguments against the
        plan, and what the checks decided for their layout (None where the query's parts were not
        looked at for a join: a rope scale of its own makes a copy)."""
        config, step, device = self._config, self._step, self.device
        assert config is not None and step is not None
        cache_parts = tensors.cache_parts()
        cache = _joined_cache(cache_parts, config, step, device)
        scale, q_pe_factor = _cache_scale(config, cache, ckv_scale, kpe_scale, kv_scale)
        query_parts = tensors.query_parts()
        q = _joined_query(query_parts, config, step, device, q_pe_factor)
        _check_output("out", tensors.out, (step.total_q, config.num_heads, config.head_dim_ckv), config.q_data_type, device)
        if tensors.lse is not None:
            _check_output("lse", tensors.lse, (step.total_q, config.num_heads), torch.float32, device)
        query_shape = None
        if step.cu_seqlens_q is None:
            query_shape = (step.total_q // step.q_len, step.q_len, config.num_heads, config.dim)
            q = q.reshape(query_shape)
        if len(query_parts) == 2 and q_pe_factor != 1.0:
            return (q, cache, scale), None
        query_join = None if len(query_parts) == 1 else _join_of(query_parts[0][1], query_parts[1][1])
        if query_join is not None and query_shape is not None:
            query_join = query_join.with_rows(query_shape)
        cache_join = None if len(cache_parts) == 1 else _join_of(cache_parts[0][1], cache_parts[1][1])
        return (q, cache, scale), _RunLayout(cache_join, query_join, query_shape)

    def _known_inputs(
        self, known: _RunLayout, tensors: _RunTensors, ckv_scale: object, kpe_scale: object, kv_scale: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """`_checked_inputs`'s tensors for a layout it has passed under this plan, re-reading only what
        a layout does not fix (the pairs' storage, the number of pages, the scales); None when one of
        those differs from what the layout's checks saw (the full checks then run)."""
        config, step = self._config, self._step
        assert config is not None and step is not None
        cache_join, query_join, query_shape = known
        cache = tensors.kv_cache if cache_join is None else cache_join.view(*tensors.cache_pair())
        if cache is None or cache.shape[0] <= step.largest_page:
            return None
        scale, q_pe_factor = _cache_scale(config, cache, ckv_scale, kpe_scale, kv_scale)
        if query_join is not None and q_pe_factor == 1.0:
            q = query_join.view(*tensors.query_pair())
            if q is not None:
                return q, cache, scale
        parts = (tensors.query,) if isinstance(tensors.query, torch.Tensor) else tensors.query_pair()
        q = _query_from(parts, config, q_pe_factor)
        return (q if query_shape is None else q.reshape(query_shape)), cache, scale

    def _attend(
        self, q: torch.Tensor, cache: torch.Tensor, kv_scale: torch.Tensor | None, out: torch.Tensor | None,
        lse: torch.Tensor | None, wants_lse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """mlakit's decode (uniform query tokens per row, q `[rows, q_len, heads, dim]`) or extend
        (ragged, q `[total_q, heads, dim]`) over the step's rows, written into `out` `[total_q, heads,
        ckv]` and `lse` `[total_q, heads]` (natural log) where given."""
        config, step = self._config, self._step
        assert config is not None and step is not None
        if step.cu_seqlens_q is not None:
            return mla_extend(
                q, cache, step.block_table, step.cache_seqlens, step.cu_seqlens_q, max_q_len=step.max_q_len,
                softmax_scale=config.sm_scale, backend=self._backend, kv_scale=kv_scale, kv_lora_rank=config.head_dim_ckv,
                check_inputs=False, metadata=step.metadata, out=out, lse=lse,
            )
        rows, q_len, heads, _ = q.shape
        total_q = rows * q_len
        if wants_lse and lse is None and q_len > 1:
            lse = torch.empty(total_q, heads, dtype=torch.float32, device=self.device)  # written in place: no copy after
        result, row_lse = mla_decode(
            q, cache, step.block_table, step.cache_seqlens, softmax_scale=config.sm_scale, backend=self._backend,
            kv_scale=kv_scale, kv_lora_rank=config.head_dim_ckv, return_lse=wants_lse, check_inputs=False,
            metadata=step.metadata, out=None if out is None else out.view(rows, q_len, heads, config.head_dim_ckv),
            # lse.view(rows, q_len, heads).transpose(1, 2) in one op (lse is contiguous)
            lse=None if lse is None else lse.as_strided((rows, heads, q_len), (q_len * heads, 1, heads)),
        )
        if out is None:
            out = result.view(total_q, heads, config.head_dim_ckv)
        if lse is None and row_lse is not None:
            lse = row_lse.view(total_q, heads)  # q_len 1: [rows, heads, 1]
        return out, lse


MAX_RUN_LAYOUTS = 256


class _RunTensors(NamedTuple):
    """run()'s tensor arguments, as given."""

    query: object
    kv_cache: object
    q_nope: object
    q_pe: object
    ckv_cache: object
    kpe_cache: object
    out: object
    lse: object

    def cache_parts(self) -> tuple[tuple[str, object], ...]:
        return _pair("kv_cache", self.kv_cache, ("ckv_cache", self.ckv_cache), ("kpe_cache", self.kpe_cache))

    def query_parts(self) -> tuple[tuple[str, object], ...]:
        return _pair("query", self.query, ("q_nope", self.q_nope), ("q_pe", self.q_pe))

    def cache_pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ckv_cache, kpe_cache), from `kv_cache=` or the legacy pair, of a call whose layout passed the checks."""
        return (self.ckv_cache, self.kpe_cache) if self.kv_cache is None else self.kv_cache  # type: ignore[return-value]

    def query_pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_nope, q_pe), from `query=` or the legacy pair, of a call whose layout passed the checks."""
        return (self.q_nope, self.q_pe) if self.query is None else self.query  # type: ignore[return-value]

    def layout_key(self, device: torch.device) -> tuple | None:
        """Everything the checks of `_checked_inputs` read but the plan, the scales and storage:
        each tensor's shape, dtype and device, a pair's strides and storage offsets, the outputs'
        contiguity; None when an argument is not of a usual form (the full checks then run)."""
        cache = _parts_key(self.kv_cache, self.ckv_cache, self.kpe_cache)
        query = _parts_key(self.query, self.q_nope, self.q_pe)
        out, lse = self.out, self.lse
        if cache is None or query is None:
            return None
        if out is not None:
            if not isinstance(out, torch.Tensor):
                return None
            out = out.shape, out.dtype, out.device, out.is_contiguous()
        if lse is not None:
            if not isinstance(lse, torch.Tensor):
                return None
            lse = lse.shape, lse.dtype, lse.device, lse.is_contiguous()
        return device, cache, query, out, lse


def _parts_key(whole: object, left: object, right: object) -> tuple | None:
    """The layout of `whole` (a tensor, or a pair of tensors) or of the legacy pair (left, right);
    None for any other form."""
    if whole is None:
        return _pair_key(left, right)
    if left is not None or right is not None:
        return None
    if isinstance(whole, torch.Tensor):
        return whole.shape, whole.dtype, whole.device
    if type(whole) is tuple and len(whole) == 2:
        return _pair_key(*whole)
    return None


def _pair_key(left: object, right: object) -> tuple | None:
    if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
        return None
    return (
        left.shape, left.stride(), left.storage_offset(), left.dtype, left.device,
        right.shape, right.stride(), right.storage_offset(), right.dtype, right.device,
    )


class _Join(NamedTuple):
    """Two tensors whose columns sit side by side in the same rows, as one view over both:
    its shape, strides and storage offset (elements), and the storage bytes it reaches."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    end: int

    def view(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor | None:
        """The view over both, when they share one storage that holds it, else None."""
        storage = left.untyped_storage()
        if storage.data_ptr() != right.untyped_storage().data_ptr() or storage.nbytes() < self.end:
            return None
        return left.as_strided(self.shape, self.stride, self.offset)

    def with_rows(self, shape: tuple[int, int, int, int]) -> _Join:
        """The view's first dim split into `shape`'s first two (`[rows * q_len, ...]` as `[rows, q_len, ...]`)."""
        return self._replace(shape=shape, stride=(shape[1] * self.stride[0], *self.stride))


class _RunLayout(NamedTuple):
    """What run()'s checks decided for one layout of its tensors under the current plan: how the
    cache pair joins (None: one kv_cache tensor), how the query pair joins as the kernel's query
    (None: one query tensor, or parts that are not side by side), and the decode kernel's query
    shape `[rows, q_len, heads, dim]` (None: the step runs as an extend, on the query as it is)."""

    cache_join: _Join | None
    query_join: _Join | None
    query_shape: tuple[int, int, int, int] | None


@dataclasses.dataclass(frozen=True)
class StepRequests:
    """A step's requests from either metadata form: query offsets, cache lengths and usable
    pages per request (host), the page table `[batch, max_pages]` (device) and the largest page
    id any request reads (-1 when none does)."""

    query_offsets: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int
    block_table: torch.Tensor
    largest_page: int

    def __post_init__(self) -> None:
        if len(self.query_offsets) != len(self.kv_lens) + 1 or self.block_table.shape[0] != len(self.kv_lens):
            raise ValueError("query offsets, lengths and page-table rows describe different batches")

    @property
    def pages_needed(self) -> tuple[int, ...]:
        return tuple(-(-n // self.page_size) for n in self.kv_lens)


@dataclasses.dataclass
class _GraphBuffers:
    """The fixed tensors a captured `run()` reads: FlashInfer's four CSR buffers (given at
    construction, rewritten by every accepted plan with the pages each request reads) and mlakit's step
    (allocated by the first plan, refilled in place by later ones, which must keep the first
    plan's configuration and query offsets)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_len_arr: torch.Tensor
    max_pages_per_request: int
    config: PlanConfig | None = None
    step: PlannedStep | None = None

    @classmethod
    def of(
        cls,
        device: torch.device,
        qo_indptr: torch.Tensor | None,
        kv_indptr: torch.Tensor | None,
        kv_indices: torch.Tensor | None,
        kv_len_arr: torch.Tensor | None,
        max_pages_per_request: int | None,
    ) -> _GraphBuffers:
        named = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)
        for name, buffer in named.items():
            if not isinstance(buffer, torch.Tensor) or buffer.dim() != 1 or buffer.dtype != torch.int32 or buffer.device != device:
                raise MLAInputError(
                    f"{name}: expected an int32 tensor [n] on {device} (use_cuda_graph=True needs all four fixed "
                    f"buffers), got {describe(buffer)}"
                )
        assert qo_indptr is not None and kv_indptr is not None and kv_indices is not None and kv_len_arr is not None
        batch = kv_len_arr.shape[0]
        for name in ("qo_indptr", "kv_indptr"):
            if named[name].shape[0] != batch + 1:
                raise MLAInputError(f"{name}: expected [batch + 1] = [{batch + 1}] (kv_len_arr holds {batch}), got {describe(named[name])}")
        if max_pages_per_request is None:
            if kv_indices.shape[0] < 1:
                raise MLAInputError(f"kv_indices: expected room for at least one page (the page table's width without "
                                    f"max_pages_per_request), got {describe(kv_indices)}")
            width = kv_indices.shape[0]
        elif not is_positive_int(max_pages_per_request):
            raise MLAInputError(f"max_pages_per_request: expected an integer >= 1, got {max_pages_per_request!r}")
        else:
            width = max_pages_per_request
        return cls(qo_indptr, kv_indptr, kv_indices, kv_len_arr, width)

    def hold(self, step: PlannedStep, requests: StepRequests, config: PlanConfig) -> PlannedStep:
        """Writes the plan into the fixed buffers once `_check` accepts it (a refused plan writes
        nothing); returns the step whose tensors are the fixed ones."""
        self._check(step, requests, config)
        self._write_csr(requests)
        if self.step is None:
            self.config, self.step = config, _widened(step, self.max_pages_per_request)
            return self.step
        held = self.step
        columns = min(held.block_table.shape[1], step.block_table.shape[1])
        held.block_table.zero_()
        held.block_table[:, :columns].copy_(step.block_table[:, :columns])
        held.cache_seqlens.copy_(step.cache_seqlens)
        _copy_tensors_into(held.metadata.data, step.metadata.data)
        return dataclasses.replace(held, largest_page=step.largest_page)

    def _check(self, step: PlannedStep, requests: StepRequests, config: PlanConfig) -> None:
        """Raises MLAInputError where the plan does not fit the fixed buffers or, after the first
        plan, changes what captured launches hold: the configuration, the query offsets, the split
        plan's host values and tensor shapes."""
        batch, pages_needed = len(requests.kv_lens), requests.pages_needed
        if batch != self.kv_len_arr.shape[0]:
            raise MLAInputError(f"kv_len_arr: the CUDA-graph buffers hold {self.kv_len_arr.shape[0]} requests, got {batch}")
        if max(pages_needed, default=0) > self.max_pages_per_request:
            raise MLAInputError(
                f"max_pages_per_request: a request of this plan reads {max(pages_needed)} pages, more than the fixed page "
                f"table holds ({self.max_pages_per_request}); construct the wrapper with a larger max_pages_per_request"
            )
        if sum(pages_needed) > self.kv_indices.shape[0]:
            raise MLAInputError(f"kv_indices: the fixed buffer holds {self.kv_indices.shape[0]} pages, the plan reads {sum(pages_needed)}")
        if self.step is None:
            return
        if config != self.config:
            raise MLAInputError(
                f"plan(): a CUDA-graph wrapper keeps its first plan's {self.config} (captured launches use them), "
                f"got {config}; use another wrapper for another configuration"
            )
        if step.query_offsets != self.step.query_offsets:
            raise MLAInputError(
                f"qo_indptr: a CUDA-graph wrapper keeps the query offsets of its first plan "
                f"{list(self.step.query_offsets)}, got {list(step.query_offsets)}; use another wrapper for another shape"
            )
        _check_refillable(self.step.metadata.data, step.metadata.data)

    def _write_csr(self, requests: StepRequests) -> None:
        """FlashInfer's four buffers for the plan's requests (already checked to fit)."""
        pages = requests.block_table[_used_pages(requests)]
        page_offsets = [0]
        for count in requests.pages_needed:
            page_offsets.append(page_offsets[-1] + count)
        self.qo_indptr.copy_(upload_ints(requests.query_offsets, self.qo_indptr.device, torch.int32))
        self.kv_indptr.copy_(upload_ints(page_offsets, self.kv_indptr.device, torch.int32))
        self.kv_indices[: pages.shape[0]].copy_(pages)
        self.kv_len_arr.copy_(upload_ints(requests.kv_lens, self.kv_len_arr.device, torch.int32))


def _mlakit_backend(backend: object, device: torch.device) -> str:
    if isinstance(backend, str) and backend in MLAKIT_BACKENDS:
        return backend
    if isinstance(backend, str) and backend in FLASHINFER_BACKENDS:
        return "triton" if device.type == "cuda" else "reference"
    raise MLAInputError(f"backend: expected one of {sorted(FLASHINFER_BACKENDS | MLAKIT_BACKENDS)}, got {backend!r}")


def _requests_from(
    metadata: object | None, flat: MLAPlanMetadata, page_size: int, device: torch.device
) -> StepRequests:
    """The step's requests from `metadata=` (ours or FlashInfer's object) or the flat arguments."""
    flat_given = [f.name for f in dataclasses.fields(flat) if getattr(flat, f.name) is not None]
    if metadata is not None and flat_given:
        raise MLAInputError(f"metadata: pass either metadata= or the flat arguments, got both (and {', '.join(flat_given)})")
    source = flat if metadata is None else metadata
    dense = [getattr(source, name, None) for name in ("cum_seq_lens_q", "block_tables", "seq_lens")]
    csr = [getattr(source, name, None) for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")]
    if metadata is None and any(t is not None for t in dense) and any(t is not None for t in csr):
        raise MLAInputError("cum_seq_lens_q: the flat CSR (qo_indptr, ...) and dense (cum_seq_lens_q, ...) forms cannot be mixed")
    if metadata is not None and all(t is None for t in dense + csr):
        raise MLAInputError(
            "metadata: expected MLAPlanMetadata.csr(...) / .dense(...) or FlashInfer's metadata object (its CSR or "
            f"dense fields), got {type(metadata).__name__} without them"
        )
    if any(t is not None for t in dense):
        return _dense_requests(*dense, getattr(source, "max_q_len", None), page_size, device)
    if any(t is not None for t in csr):
        return _csr_requests(*csr, page_size, device)
    raise MLAInputError(
        "qo_indptr: plan() needs the CSR metadata (qo_indptr, kv_indptr, kv_indices, kv_len_arr), the dense one "
        "(cum_seq_lens_q, block_tables, seq_lens) or metadata=MLAPlanMetadata.csr(...)/.dense(...), got none"
    )


def _csr_requests(
    qo_indptr: object, kv_indptr: object, kv_indices: object, kv_len_arr: object, page_size: int, device: torch.device
) -> StepRequests:
    kv_lens = _host_ints("kv_len_arr", kv_len_arr)
    query_offsets = _host_offsets("qo_indptr", qo_indptr, len(kv_lens))
    page_offsets = _host_offsets("kv_indptr", kv_indptr, len(kv_lens))
    indices = _int32_tensor("kv_indices", kv_indices, dims=1)
    total = page_offsets[-1]
    if indices.shape[0] < total:
        raise MLAInputError(f"kv_indices: expected at least kv_indptr[-1] = {total} page ids, got {describe(indices)}")
    counts = torch.tensor([b - a for a, b in zip(page_offsets, page_offsets[1:])], dtype=torch.long)
    table = torch.zeros(len(kv_lens), max(1, int(counts.max()) if len(kv_lens) else 1), dtype=torch.int32, device=device)
    rows = torch.arange(len(kv_lens)).repeat_interleave(counts, output_size=total)
    columns = torch.arange(total) - torch.tensor(page_offsets[:-1], dtype=torch.long).repeat_interleave(counts, output_size=total)
    table[upload(rows, device), upload(columns, device)] = upload(indices[:total], device)
    return _checked_requests(query_offsets, kv_lens, page_size, table, counts.tolist(), "kv_indices", "kv_len_arr")


def _dense_requests(
    cum_seq_lens_q: object, block_tables: object, seq_lens: object, max_q_len: object, page_size: int, device: torch.device
) -> StepRequests:
    kv_lens = _host_ints("seq_lens", seq_lens)
    if not kv_lens:
        raise MLAInputError("seq_lens: expected one length per request and at least one request, got none")
    query_offsets = _host_offsets("cum_seq_lens_q", cum_seq_lens_q, len(kv_lens))
    table = _int32_tensor("block_tables", block_tables, dims=2)
    if table.shape[0] != len(kv_lens):
        raise MLAInputError(f"block_tables: expected [batch, max_pages] with batch = {len(kv_lens)} (seq_lens), got {describe(table)}")
    longest = max(b - a for a, b in zip(query_offsets, query_offsets[1:]))
    if max_q_len is not None and (not is_positive_int(max_q_len) or max_q_len < longest):
        raise MLAInputError(f"max_q_len: expected None or an integer >= the longest query segment ({longest}), got {max_q_len!r}")
    table = upload(table, device).contiguous()
    return _checked_requests(query_offsets, kv_lens, page_size, table, [table.shape[1]] * len(kv_lens), "block_tables", "seq_lens")


def _checked_requests(
    query_offsets: tuple[int, ...],
    kv_lens: tuple[int, ...],
    page_size: int,
    table: torch.Tensor,
    pages_given: list[int],
    pages_name: str,
    lengths_name: str,
) -> StepRequests:
    """Checks lengths against the pages each request was given and page ids for sign, and finds
    the largest page id read (one small sync)."""
    requests = StepRequests(query_offsets, kv_lens, page_size, table, -1)
    for b, (length, needed, given) in enumerate(zip(kv_lens, requests.pages_needed, pages_given)):
        if length < 0:
            raise MLAInputError(f"{lengths_name}: expected lengths >= 0, got {lengths_name}[{b}] = {length}")
        if needed > given:
            raise MLAInputError(
                f"{pages_name}: request {b} holds {length} tokens, which need {needed} pages of {page_size}, "
                f"but it was given {given}"
            )
    read = table[_used_pages(requests)]
    if read.numel() == 0:
        return requests
    smallest, largest = torch.stack([read.min(), read.max()]).tolist()
    if smallest < 0:
        raise MLAInputError(f"{pages_name}: expected page ids >= 0 for every page a request reads, got {smallest}")
    return dataclasses.replace(requests, largest_page=largest)


def _used_pages(requests: StepRequests) -> torch.Tensor:
    """Bool `[batch, max_pages]`: the page-table entries each request reads."""
    table = requests.block_table
    needed = upload_ints(requests.pages_needed, table.device, torch.long)
    return torch.arange(table.shape[1], device=table.device)[None, :] < needed[:, None]


def _page_size_hint(config: PlanConfig) -> int | None:
    """The plan's `page_size` hint, from the planned layout (`plan()` sees no cache)."""
    kv_scale_mode = SCALE_PER_GROUP if config.kv_scale_layout == "group" else SCALE_PER_TENSOR
    return layout_page_size_hint(config.page_size, config.head_dim_ckv, config.head_dim_kpe,
                                 config.kv_data_type == FP8_DTYPE, kv_scale_mode)


def _plan_step(requests: StepRequests, config: PlanConfig, backend: str, page_size_hint: int | None,
               hint_tokens: bool = True) -> PlannedStep:
    """The rows mlakit's kernels run: one per request, as a decode when every request has the same
    number of query tokens and as an extend when they differ; with `causal=False` and several
    query tokens, one single-token row per query token (each sees its request's whole cache).
    `page_size_hint`: the metadata's `page_size`; `hint_tokens`: the metadata is told the rows' cached tokens
    (`kv_tokens_hint`), which a CUDA-graph wrapper's is not: its captured kernels replay whatever lengths later plans
    bring, so they must not follow the tokens of the plan they were captured with."""
    offsets = requests.query_offsets
    q_lens = [b - a for a, b in zip(offsets, offsets[1:])]
    if offsets[-1] == 0:
        raise MLAInputError(f"qo_indptr: expected at least one query token in the step, got offsets {list(offsets)}")
    device = requests.block_table.device
    table = requests.block_table
    lengths = upload_ints(requests.kv_lens, device, torch.int32)
    kv_tokens = sum(requests.kv_lens)
    if not config.causal and max(q_lens) > 1:
        kv_tokens = sum(n * q for n, q in zip(requests.kv_lens, q_lens))
        per_token = upload_ints(q_lens, device, torch.long)
        table = table.repeat_interleave(per_token, dim=0, output_size=offsets[-1])
        lengths = lengths.repeat_interleave(per_token, output_size=offsets[-1])
        q_lens = [1] * offsets[-1]
    kv_tokens_hint = kv_tokens if hint_tokens else None
    if len(set(q_lens)) == 1:
        metadata = mla_decode_metadata(lengths, q_len=q_lens[0], heads=config.num_heads, backend=backend,
                                       kv_cache_dtype=storage_name(config.kv_data_type),
                                       kv_tokens_hint=kv_tokens_hint, page_size=page_size_hint)
        return PlannedStep(offsets, table, lengths, q_lens[0], None, metadata, requests.largest_page)
    cu_seqlens_q = upload_ints(offsets, device, torch.int32)
    metadata = mla_extend_metadata(lengths, cu_seqlens_q, max_q_len=max(q_lens), heads=config.num_heads, backend=backend,
                                   kv_cache_dtype=storage_name(config.kv_data_type), kv_tokens_hint=kv_tokens_hint,
                                   page_size=page_size_hint)
    return PlannedStep(offsets, table, lengths, 0, cu_seqlens_q, metadata, requests.largest_page)


def _widened(step: PlannedStep, width: int) -> PlannedStep:
    """The step with its page table copied into a fixed `[rows, width]` table."""
    table = torch.zeros(step.block_table.shape[0], width, dtype=torch.int32, device=step.block_table.device)
    columns = min(width, step.block_table.shape[1])
    table[:, :columns] = step.block_table[:, :columns]
    return dataclasses.replace(step, block_table=table)


def _plan_values(target: object, source: object) -> Iterator[tuple[str, object, object]]:
    """(name, held value, new value) for each plan value of a backend's per-step metadata (not its
    caches of prepared launches)."""
    for field in dataclasses.fields(target):
        if field.compare:
            yield field.name, getattr(target, field.name), getattr(source, field.name)


def _check_refillable(target: object, source: object) -> None:
    """Raises MLAInputError where `source`'s per-step metadata cannot be copied into `target`'s in
    place (a host value or a tensor's shape differs)."""
    if target is None:
        return
    for name, held, new in _plan_values(target, source):
        if isinstance(held, torch.Tensor):
            held, new = tuple(held.shape), tuple(new.shape)
        if held != new:
            raise MLAInputError(f"plan(): the re-plan changed the captured split plan's {name} ({held} -> {new})")


def _copy_tensors_into(target: object, source: object) -> None:
    """Refills a backend's per-step metadata in place (captured launches hold its tensors' addresses);
    `_check_refillable` has accepted the pair."""
    if target is None:
        return
    for _, held, new in _plan_values(target, source):
        if isinstance(held, torch.Tensor):
            held.copy_(new)


def _pair(
    name: str, value: object, left: tuple[str, object], right: tuple[str, object]
) -> tuple[tuple[str, object], ...]:
    """`name=` as one packed tensor or a (left, right) pair, or the legacy pair of arguments."""
    if value is not None:
        if left[1] is not None or right[1] is not None:
            raise MLAInputError(f"{name}: pass either {name}= or {left[0]} and {right[0]}, not both")
        if isinstance(value, tuple):
            if len(value) != 2:
                raise MLAInputError(f"{name}: expected a tensor or a pair ({left[0]}, {right[0]}), got a tuple of {len(value)}")
            return (left[0], value[0]), (right[0], value[1])
        return ((name, value),)
    if left[1] is None or right[1] is None:
        missing = left[0] if left[1] is None else right[0]
        raise MLAInputError(f"{missing}: expected {name}= or both {left[0]} and {right[0]}, got None")
    return left, right


def _joined_cache(
    parts: tuple[tuple[str, object], ...], config: PlanConfig, step: PlannedStep, device: torch.device
) -> torch.Tensor:
    """The cache as one `[num_pages, page_size, ckv + kpe]` tensor, checked against the plan."""
    if len(parts) == 1:
        name, cache = parts[0]
        return _checked_cache(name, _tensor(name, cache), config, step, device)
    (ckv_name, ckv), (kpe_name, kpe) = ((name, _tensor(name, t)) for name, t in parts)
    for name, part in ((ckv_name, ckv), (kpe_name, kpe)):
        _check_dtype_device(name, part, config.kv_data_type, "kv_data_type", device)
    if ckv.shape[-1:] != (config.head_dim_ckv,) or kpe.shape[-1:] != (config.head_dim_kpe,):
        bad, width = (ckv_name, config.head_dim_ckv) if ckv.shape[-1:] != (config.head_dim_ckv,) else (kpe_name, config.head_dim_kpe)
        raise MLAInputError(f"{bad}: expected a last dim of {width} (as planned), got {describe(ckv if bad == ckv_name else kpe)}")
    joined = _adjacent_view(ckv, kpe)
    if joined is None:
        raise MLAInputError(
            f"{kpe_name}: expected a view of the same [num_pages, page_size, {config.dim}] buffer as {ckv_name} (its "
            f"columns {config.head_dim_ckv}:{config.dim}), got a separate tensor; mlakit reads one row per token: "
            f"allocate one buffer and pass {ckv_name}=buf[..., :{config.head_dim_ckv}], "
            f"{kpe_name}=buf[..., {config.head_dim_ckv}:] (or kv_cache=buf)"
        )
    return _checked_cache(ckv_name, joined, config, step, device)


def _checked_cache(name: str, cache: torch.Tensor, config: PlanConfig, step: PlannedStep, device: torch.device) -> torch.Tensor:
    if cache.dim() != 3 or tuple(cache.shape[1:]) != (config.page_size, config.dim):
        raise MLAInputError(
            f"{name}: expected [num_pages, page_size {config.page_size}, {config.dim}] (as planned), got {describe(cache)}"
        )
    _check_dtype_device(name, cache, config.kv_data_type, "kv_data_type", device)
    if cache.shape[0] <= step.largest_page:
        raise MLAInputError(f"{name}: the plan reads page {step.largest_page}, the cache holds {cache.shape[0]} pages")
    return cache


def _cache_scale(
    config: PlanConfig, cache: torch.Tensor, ckv_scale: object, kpe_scale: object, kv_scale: torch.Tensor | None
) -> tuple[torch.Tensor | None, float]:
    """mlakit's `kv_scale` for the cache, and the factor the rope part of the query takes so that
    a `kpe_scale` different from `ckv_scale` holds (q_pe . kpe * kpe_scale = (q_pe * kpe_scale /
    ckv_scale) . kpe * ckv_scale)."""
    floats = ckv_scale is not None or kpe_scale is not None
    if config.kv_data_type != FP8_DTYPE:
        if floats or kv_scale is not None:
            name = "kv_scale" if kv_scale is not None else "ckv_scale" if ckv_scale is not None else "kpe_scale"
            raise MLAInputError(f"{name}: expected None for a {config.kv_data_type} cache (scales are for fp8 caches), got a value")
        return None, 1.0
    if kv_scale is not None:
        if floats:
            raise MLAInputError("kv_scale: pass either kv_scale= or ckv_scale and kpe_scale, not both")
        return kv_scale, 1.0
    ckv, kpe = _positive_float("ckv_scale", ckv_scale), _positive_float("kpe_scale", kpe_scale)
    return torch.full((1,), ckv, dtype=torch.float32, device=cache.device), kpe / ckv


def _joined_query(
    parts: tuple[tuple[str, object], ...], config: PlanConfig, step: PlannedStep, device: torch.device, q_pe_factor: float
) -> torch.Tensor:
    """The query as one `[total_q, heads, ckv + kpe]` tensor: a view when it is one (or the two
    parts are views of one buffer) and the rope part keeps its scale, else a copy."""
    rows, heads = step.total_q, config.num_heads
    if len(parts) == 1:
        name, q = parts[0]
        return _query_from((_checked_query(name, q, (rows, heads, config.dim), config, device),), config, q_pe_factor)
    (nope_name, nope), (pe_name, pe) = parts
    nope = _checked_query(nope_name, nope, (rows, heads, config.head_dim_ckv), config, device)
    pe = _checked_query(pe_name, pe, (rows, heads, config.head_dim_kpe), config, device)
    joined = _adjacent_view(nope, pe) if q_pe_factor == 1.0 else None
    return _query_from((nope, pe), config, q_pe_factor) if joined is None else joined


def _query_from(parts: tuple[torch.Tensor, ...], config: PlanConfig, q_pe_factor: float) -> torch.Tensor:
    """The checked query (one tensor, or two parts that are not one view) with the rope part times
    `q_pe_factor`, as one tensor: itself when it is one and the factor is 1, else a copy."""
    if len(parts) == 1:
        if q_pe_factor == 1.0:
            return parts[0]
        nope, pe = parts[0][..., : config.head_dim_ckv], parts[0][..., config.head_dim_ckv :]
    else:
        nope, pe = parts
    if q_pe_factor != 1.0:
        pe = (pe.float() * q_pe_factor).to(pe.dtype)
    return torch.cat([nope, pe], dim=-1)


def _checked_query(name: str, q: object, shape: tuple[int, int, int], config: PlanConfig, device: torch.device) -> torch.Tensor:
    q = _tensor(name, q)
    if tuple(q.shape) != shape:
        raise MLAInputError(f"{name}: expected shape {list(shape)} ([total_q, num_heads, dim] as planned), got {describe(q)}")
    _check_dtype_device(name, q, config.q_data_type, "q_data_type", device)
    return q


def _adjacent_view(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor | None:
    """One tensor over both when `right`'s columns follow `left`'s in the same rows of one buffer
    (same shape but the last dim, same strides, unit column stride, in bounds), else None."""
    join = _join_of(left, right)
    return None if join is None else join.view(left, right)


def _join_of(left: torch.Tensor, right: torch.Tensor) -> _Join | None:
    """`_adjacent_view`'s geometry, from the tensors' layouts alone: whether they share a storage that
    holds the view is left to `_Join.view`."""
    width = left.shape[-1] + right.shape[-1]
    if (
        left.dim() != right.dim()
        or left.shape[:-1] != right.shape[:-1]
        or left.stride() != right.stride()
        or left.dtype != right.dtype
        or left.device != right.device
        or left.stride(-1) != 1
        or right.storage_offset() != left.storage_offset() + left.shape[-1]
        or any(size > 1 and stride < width for size, stride in zip(left.shape[:-1], left.stride()[:-1]))
    ):
        return None
    shape = (*left.shape[:-1], width)
    last = left.storage_offset() + sum((size - 1) * stride for size, stride in zip(shape, left.stride()))
    return _Join(shape, left.stride(), left.storage_offset(), (last + 1) * left.element_size())


def _check_output(name: str, given: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """`given` (None, or a tensor run() fills) checked against the result's shape, dtype and device."""
    if given is None:
        return
    if not isinstance(given, torch.Tensor) or tuple(given.shape) != shape or given.dtype != dtype or given.device != device:
        raise MLAInputError(f"{name}: expected a {dtype} tensor {list(shape)} on {device}, got {describe(given)}")
    if not given.is_contiguous():
        raise MLAInputError(f"{name}: expected a contiguous tensor (run() writes it in place), got strides {given.stride()}")


def _host_ints(name: str, tensor: object) -> tuple[int, ...]:
    return tuple(_int32_tensor(name, tensor, dims=1).tolist())


def _host_offsets(name: str, tensor: object, batch: int) -> tuple[int, ...]:
    offsets = _host_ints(name, tensor)
    if len(offsets) != batch + 1:
        raise MLAInputError(f"{name}: expected [batch + 1] = [{batch + 1}] offsets (batch from the lengths), got {len(offsets)}")
    if offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise MLAInputError(f"{name}: expected non-decreasing offsets from 0, got {list(offsets)}")
    return offsets


def _int32_tensor(name: str, tensor: object, *, dims: int) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != dims or tensor.dtype != torch.int32:
        raise MLAInputError(f"{name}: expected an int32 tensor of {dims} dimension(s), got {describe(tensor)}")
    return tensor


def _tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise MLAInputError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    return value


def _check_dtype_device(name: str, tensor: torch.Tensor, dtype: torch.dtype, planned: str, device: torch.device) -> None:
    if tensor.dtype != dtype:
        raise MLAInputError(f"{name}: expected dtype {dtype} (the planned {planned}), got {tensor.dtype}")
    if tensor.device != device:
        raise MLAInputError(f"{name}: expected a tensor on {device} (the workspace buffer's device), got {tensor.device}")


def _positive_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise MLAInputError(f"{name}: expected a finite float > 0 for the fp8 cache (dequantized = stored * scale), got {value!r}")
    return float(value)


_REFUSAL_HINTS = {
    "ckv_scale_arr": "pass mlakit's kv_scale= with per-group scales [num_pages, page_size, ceil((ckv + kpe) / 128)]",
    "bmm1_scale": "pass sm_scale to plan() and ckv_scale / kpe_scale (or kv_scale=) to run()",
    "bmm2_scale": "pass sm_scale to plan() and ckv_scale / kpe_scale (or kv_scale=) to run()",
    "kv_len": "plan() with the step's lengths (metadata=MLAPlanMetadata.dense(...)) instead",
    "page_table": "plan() with the step's page table (metadata=MLAPlanMetadata.dense(...)) instead",
}


def _refuse_given(**options: object) -> None:
    """Raises MLAInputError naming the first option that is set (not None or False)."""
    for name, value in options.items():
        if value is not None and value is not False:
            hint = _REFUSAL_HINTS.get(name, "leave it unset")
            raise MLAInputError(f"{name}: not supported by mlakit.compat.flashinfer ({hint}), got {describe(value)}")


def _check_choice(name: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise MLAInputError(f"{name}: expected one of {list(allowed)} (what mlakit.compat.flashinfer supports), got {value!r}")
