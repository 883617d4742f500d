"""FlashMLA's decode API on mlakit's kernels: swap the import, keep the call sites.

    from mlakit.compat.flash_mla import get_mla_metadata, flash_mla_with_kvcache

`get_mla_metadata` and `flash_mla_with_kvcache` take FlashMLA's argument names, defaults and
shapes and return what FlashMLA returns: out `[b, s_q, h_q, head_dim_v]` in q's dtype and lse
`[b, h_q, s_q]` float32 (natural log; +inf where a query sees no key, as FlashMLA writes it).
The work runs on mlakit's `triton` backend when q is on a CUDA device and on the `reference`
backend elsewhere (so an engine's CPU tests can call them), never on FlashMLA itself.

Beyond FlashMLA: any page size, any head count, latent widths other than 512 + 64 (pass
`head_dim_v`), any number of query tokens, fp16 or bf16, and plain fp8-e4m3 caches of
`q.shape[-1]` columns with `is_fp8_kvcache=True` and the keyword `kv_scale=` (a per-tensor scale
`[1]` or per-group scales, as `mlakit.mla_decode` takes them). Sparse attention (`indices`,
`topk_length`, `topk`), `attn_sink`, extra caches and FlashMLA's packed 656-byte fp8 layout raise
MLAInputError naming them.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from mlakit.attention.functional import DecodeMetadata, mla_decode, mla_decode_metadata
from mlakit.cache.kv_quant import FP8_DTYPE, storage_name
from mlakit.compat._arguments import describe, is_flag, is_positive_int
from mlakit.errors import MLAInputError
from mlakit.kernels.seesaw_layout import decode_page_size_hint

# FlashMLA's packed fp8 row for DeepSeek's 512 + 64 widths: 512 e4m3 values, 4 float32 scales, 64 bf16 rope values.
_PACKED_FP8_ROW_BYTES = 656


@dataclasses.dataclass(frozen=True)
class ScheduleLayout:
    """What a schedule was filled for; later calls sharing the schedule must match it."""

    batch: int
    s_q: int
    h_q: int
    page_block_size: int
    causal: bool
    kv_cache_dtype: str


@dataclasses.dataclass
class FlashMLASchedule:
    """One decode step's schedule, from `get_mla_metadata`: empty until the first
    `flash_mla_with_kvcache` call fills it (mlakit's `DecodeMetadata` for that call's lengths
    and layout), then shared by every later call (every layer of the step) with the same
    lengths and layout. Make a new one per step, as FlashMLA's callers do.

    The older call form of `get_mla_metadata` records what its arguments declared
    (`cache_seqlens`, query rows per KV head, `num_heads_q`, `is_fp8_kvcache`); the first call is
    checked against them and plans from those lengths.
    """

    cache_seqlens: torch.Tensor | None = None
    rows_per_head_k: int | None = None
    num_heads_q: int | None = None
    is_fp8_kvcache: bool | None = None
    layout: ScheduleLayout | None = None
    metadata: DecodeMetadata | None = None

    def __post_init__(self) -> None:
        if self.cache_seqlens is not None and (
            not isinstance(self.cache_seqlens, torch.Tensor) or self.cache_seqlens.dim() != 1 or self.cache_seqlens.dtype != torch.int32
        ):
            raise MLAInputError(f"cache_seqlens: expected an int32 tensor [batch], got {describe(self.cache_seqlens)}")
        for name in ("rows_per_head_k", "num_heads_q"):
            value = getattr(self, name)
            if value is not None and not is_positive_int(value):
                raise MLAInputError(f"{name}: expected an integer >= 1, got {value!r}")

    @property
    def have_initialized(self) -> bool:
        """Whether a call has filled the schedule (FlashMLA's name for it)."""
        return self.metadata is not None


def get_mla_metadata(
    cache_seqlens: torch.Tensor | None = None,
    num_q_tokens_per_head_k: int | None = None,
    num_heads_k: int | None = None,
    num_heads_q: int | None = None,
    is_fp8_kvcache: bool = False,
    topk: int | None = None,
    *,
    num_heads_per_head_k: int | None = None,
) -> tuple[FlashMLASchedule, None]:
    """A new, empty schedule for one decode step, as the pair FlashMLA returns: pass both items
    on to every layer's `flash_mla_with_kvcache` (the second is always None).

    Both of FlashMLA's call forms work: the current `get_mla_metadata()` with no arguments, and
    the older `get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
    is_fp8_kvcache=False, topk=None)` (first releases: `num_heads_per_head_k` for the second
    argument), whose values the first call is checked against. `num_heads_k` must be 1 (MLA's
    one latent KV head); `topk` (sparse attention) is not supported and raises.

    >>> schedule, second = get_mla_metadata()
    >>> schedule.have_initialized, second
    (False, None)
    >>> schedule, _ = get_mla_metadata(torch.tensor([70, 3], dtype=torch.int32), 2 * 16, 1)
    >>> schedule.rows_per_head_k
    32
    """
    if topk is not None:
        raise _unsupported("topk", "sparse attention")
    if num_q_tokens_per_head_k is not None and num_heads_per_head_k is not None:
        raise MLAInputError("num_heads_per_head_k: the older name of num_q_tokens_per_head_k; pass one of them, got both")
    rows = num_q_tokens_per_head_k if num_q_tokens_per_head_k is not None else num_heads_per_head_k
    if cache_seqlens is None:
        if rows is not None or num_heads_k is not None or num_heads_q is not None:
            raise MLAInputError("cache_seqlens: the older call form of get_mla_metadata needs it; call get_mla_metadata() without arguments instead")
        return FlashMLASchedule(), None
    if rows is None or num_heads_k is None:
        raise MLAInputError(
            "get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k): the older call form needs all three "
            f"(got num_q_tokens_per_head_k={rows!r}, num_heads_k={num_heads_k!r})"
        )
    if num_heads_k != 1:
        raise MLAInputError(f"num_heads_k: expected 1 (an MLA cache holds one latent KV head), got {num_heads_k!r}")
    if not is_positive_int(rows):
        name = "num_q_tokens_per_head_k" if num_q_tokens_per_head_k is not None else "num_heads_per_head_k"
        raise MLAInputError(f"{name}: expected an integer >= 1, got {rows!r}")
    if not is_flag(is_fp8_kvcache):
        raise MLAInputError(f"is_fp8_kvcache: expected a bool, got {is_fp8_kvcache!r}")
    return FlashMLASchedule(cache_seqlens, rows, num_heads_q, bool(is_fp8_kvcache)), None


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedule,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    *,
    kv_scale: torch.Tensor | None = None,
    check_inputs: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense MLA decode with FlashMLA's signature, run by `mlakit.mla_decode`.

    q `[b, s_q, h_q, d]` bf16/fp16 (d = latent + rope, 576 for DeepSeek); k_cache `[num_blocks,
    page_block_size, 1, d]` (or without the head axis) of any page size; block_table `[b,
    max_blocks]` and cache_seqlens `[b]` int32; head_dim_v the latent width (512). The schedule
    pair comes from `get_mla_metadata` (current or older form) and is filled by the first call.
    softmax_scale defaults to `d ** -0.5`. With `causal=True` and s_q > 1, query token i of a
    length-L sequence sees keys `0 .. L - s_q + i`; otherwise every query token sees all L keys.
    Returns out `[b, s_q, h_q, head_dim_v]` in q's dtype and lse `[b, h_q, s_q]` float32
    (natural log), with zeros and lse = +inf where a query sees no key, as FlashMLA.

    mlakit's additions, keyword-only: `kv_scale` (required with an fp8-e4m3 cache of d columns,
    which also needs `is_fp8_kvcache=True`), and `check_inputs`: None (default) reads lengths and
    page indices for a check when q is on the CPU and never on a GPU (the check would cost a host
    sync per call; FlashMLA checks no values either), True or False forces it.

    q's and k_cache's shapes and dtypes are checked against the other arguments once per layout
    (their shapes, dtypes and devices, head_dim_v, causal, is_fp8_kvcache and whether kv_scale is
    absent, one per-tensor scale or per-group scales): a repeated layout reuses the verdict, so
    every layer after the first costs little host time. lse's -inf become +inf in one kernel (in
    place on mla_decode's lse where it is contiguous).

    >>> q = torch.randn(2, 1, 4, 576, dtype=torch.bfloat16)
    >>> cache = torch.randn(8, 16, 1, 576, dtype=torch.bfloat16)
    >>> table, lengths = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 0], dtype=torch.int32)
    >>> schedule, num_splits = get_mla_metadata()
    >>> out, lse = flash_mla_with_kvcache(q, cache, table, lengths, 512, schedule, num_splits)
    >>> out.shape, lse.shape, lse[1].tolist()
    (torch.Size([2, 1, 4, 512]), torch.Size([2, 4, 1]), [[inf], [inf], [inf], [inf]])
    """
    _refuse_unsupported(indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)
    schedule = _checked_schedule(tile_scheduler_metadata, num_splits)
    if block_table is None or cache_seqlens is None:
        missing = "block_table" if block_table is None else "cache_seqlens"
        raise MLAInputError(f"{missing}: required for dense decode (None is only for FlashMLA's sparse attention, which mlakit does not support)")
    if check_inputs is not None and not is_flag(check_inputs):
        raise MLAInputError(f"check_inputs: expected None or a bool, got {check_inputs!r}")
    call = _checked_call(q, k_cache, head_dim_v, causal, is_fp8_kvcache, kv_scale)
    first = schedule.metadata is None
    try:
        metadata = _filled(schedule, call, cache_seqlens, q, is_fp8_kvcache)
        out, lse = mla_decode(
            q if call.folded_shape is None else q.reshape(call.folded_shape), k_cache, block_table, cache_seqlens,
            softmax_scale=softmax_scale, backend=call.backend, kv_scale=kv_scale, kv_lora_rank=head_dim_v,
            check_inputs=call.checks_values if check_inputs is None else bool(check_inputs), metadata=metadata,
        )
    except Exception:
        if first:  # a refused first call leaves the schedule for the corrected one to fill
            schedule.metadata = schedule.layout = None
        raise
    assert lse is not None  # mla_decode returns lse unless asked not to
    if call.folded_shape is not None:
        layout = call.layout
        out = out.reshape(layout.batch, layout.s_q, layout.h_q, head_dim_v)
        lse = lse.view(layout.batch, layout.s_q, layout.h_q).transpose(1, 2)
    return out, _with_posinf_for_no_keys(lse)


@dataclasses.dataclass(frozen=True)
class _CallLayout:
    """What the checks of `flash_mla_with_kvcache` decided for one layout of its arguments: the
    schedule layout, the shape q is folded to (None: q goes as it is), the backend, whether
    `check_inputs=None` reads values, and the plan's page-size hint (`decode_page_size_hint`)."""

    layout: ScheduleLayout
    folded_shape: tuple[int, int, int, int] | None
    backend: str
    checks_values: bool
    page_size_hint: int | None

    @property
    def rows(self) -> tuple[int, int]:
        """(query tokens, heads) per row of mlakit's kernel."""
        if self.folded_shape is not None:
            return 1, self.folded_shape[2]
        return self.layout.s_q, self.layout.h_q


MAX_LAYOUTS = 1024
_CALL_LAYOUTS: dict[tuple, _CallLayout] = {}


def _checked_call(
    q: torch.Tensor, k_cache: torch.Tensor, head_dim_v: int, causal: bool, is_fp8_kvcache: bool, kv_scale: torch.Tensor | None
) -> _CallLayout:
    """The checks' verdict on q, k_cache and the scalars, run in full once per layout of them."""
    key = _layout_key(q, k_cache, head_dim_v, causal, is_fp8_kvcache, kv_scale)
    call = _CALL_LAYOUTS.get(key)
    if call is None:
        call = _check_call(q, k_cache, head_dim_v, causal, is_fp8_kvcache, kv_scale)
        if key is not None:
            if len(_CALL_LAYOUTS) >= MAX_LAYOUTS:
                _CALL_LAYOUTS.clear()
            _CALL_LAYOUTS[key] = call
    return call


def _layout_key(
    q: object, k_cache: object, head_dim_v: object, causal: object, is_fp8_kvcache: object, kv_scale: object
) -> tuple | None:
    """Everything `_check_call` reads, or None (check in full every call) unless q and k_cache are
    tensors, kv_scale a tensor or None, and head_dim_v, causal and is_fp8_kvcache a plain int and bools."""
    if not (
        isinstance(q, torch.Tensor) and isinstance(k_cache, torch.Tensor) and isinstance(kv_scale, torch.Tensor | None)
        and type(head_dim_v) is int and type(causal) is bool and type(is_fp8_kvcache) is bool
    ):
        return None
    one_scale = None if kv_scale is None else kv_scale.numel() == 1
    return (q.shape, q.dtype, q.device, k_cache.shape, k_cache.dtype, head_dim_v, causal, is_fp8_kvcache, one_scale)


def _check_call(
    q: object, k_cache: object, head_dim_v: object, causal: object, is_fp8_kvcache: object, kv_scale: torch.Tensor | None
) -> _CallLayout:
    """The verdict of every check of q, k_cache and the scalars (MLAInputError naming the first that fails)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise MLAInputError(f"q: expected a tensor [batch, s_q, h_q, d], got {describe(q)}")
    for axis, size in zip(("batch", "s_q", "h_q"), q.shape[:3]):
        if size < 1:  # checked before folding: mla_decode would name the folded shape
            raise MLAInputError(f"q: expected [batch, s_q, h_q, d] with {axis} >= 1, got shape {tuple(q.shape)}")
    if not is_positive_int(head_dim_v) or head_dim_v >= q.shape[-1]:
        raise MLAInputError(f"head_dim_v: expected an integer in 1..{q.shape[-1] - 1} (the latent width, 512 for "
                            f"DeepSeek; q's last dim {q.shape[-1]} is latent + rope), got {head_dim_v!r}")
    for name, flag in (("causal", causal), ("is_fp8_kvcache", is_fp8_kvcache)):
        if not is_flag(flag):
            raise MLAInputError(f"{name}: expected a bool, got {flag!r}")
    kv_cache_dtype = _cache_dtype(k_cache, q, is_fp8_kvcache, kv_scale)
    batch, s_q, h_q, dim = q.shape
    # Without a causal mask every query token sees the same keys: fold the tokens into the heads.
    folded_shape = None if (causal and s_q > 1) or s_q == 1 else (batch, 1, s_q * h_q, dim)
    layout = ScheduleLayout(batch, s_q, h_q, k_cache.shape[1], bool(causal), kv_cache_dtype)
    hint = decode_page_size_hint(k_cache, kv_scale, head_dim_v)
    return _CallLayout(layout, folded_shape, "triton" if q.is_cuda else "reference", q.device.type == "cpu", hint)


def _with_posinf_for_no_keys(lse: torch.Tensor) -> torch.Tensor:
    """`lse`, contiguous, with FlashMLA's +inf where mlakit writes -inf (a query that sees no key);
    NaN and +inf stay. In place (one kernel) when `lse` is contiguous: mla_decode made it for this call."""
    if lse.is_contiguous():
        return lse.nan_to_num_(nan=math.nan, posinf=math.inf, neginf=math.inf)
    contiguous = torch.empty(lse.shape, dtype=lse.dtype, device=lse.device)
    return torch.nan_to_num(lse, nan=math.nan, posinf=math.inf, neginf=math.inf, out=contiguous)


def _filled(
    schedule: FlashMLASchedule, call: _CallLayout, cache_seqlens: torch.Tensor, q: torch.Tensor, is_fp8_kvcache: bool
) -> DecodeMetadata:
    """The schedule's metadata, built by this call if it is the first, after checking the layout."""
    metadata, layout = schedule.metadata, call.layout
    if metadata is None:
        _check_declared(schedule, layout, is_fp8_kvcache, q.device)
        lengths = cache_seqlens if schedule.cache_seqlens is None else schedule.cache_seqlens
        q_len, heads = call.rows
        schedule.metadata = mla_decode_metadata(
            lengths, q_len=q_len, heads=heads, backend=call.backend, kv_cache_dtype=layout.kv_cache_dtype,
            page_size=call.page_size_hint,
        )
        schedule.layout = layout
        return schedule.metadata
    if schedule.layout is not layout and schedule.layout != layout:
        raise MLAInputError(
            f"tile_scheduler_metadata: filled for {schedule.layout}, reused for {layout}; a schedule serves calls with the "
            "same lengths and layout only (make one per step with get_mla_metadata())"
        )
    if metadata.backend != call.backend:
        raise MLAInputError(f"tile_scheduler_metadata: filled for the {metadata.backend!r} backend, reused on {call.backend!r} (q moved device)")
    return metadata


def _check_declared(schedule: FlashMLASchedule, layout: ScheduleLayout, is_fp8_kvcache: bool, device: torch.device) -> None:
    """The first call against what the older form of `get_mla_metadata` declared."""
    if schedule.rows_per_head_k is not None and schedule.rows_per_head_k != layout.s_q * layout.h_q:
        raise MLAInputError(
            f"num_q_tokens_per_head_k: get_mla_metadata got {schedule.rows_per_head_k}, the call has s_q * h_q = "
            f"{layout.s_q} * {layout.h_q} = {layout.s_q * layout.h_q}"
        )
    if schedule.num_heads_q is not None and schedule.num_heads_q != layout.h_q:
        raise MLAInputError(f"num_heads_q: get_mla_metadata got {schedule.num_heads_q}, q has {layout.h_q} heads")
    if schedule.is_fp8_kvcache is not None and schedule.is_fp8_kvcache != bool(is_fp8_kvcache):
        raise MLAInputError(f"is_fp8_kvcache: get_mla_metadata got {schedule.is_fp8_kvcache}, the call {bool(is_fp8_kvcache)}")
    if schedule.cache_seqlens is not None and tuple(schedule.cache_seqlens.shape) != (layout.batch,):
        raise MLAInputError(f"cache_seqlens: get_mla_metadata got {schedule.cache_seqlens.shape[0]} lengths, q has batch {layout.batch}")
    if schedule.cache_seqlens is not None and schedule.cache_seqlens.device != device:
        raise MLAInputError(f"cache_seqlens: get_mla_metadata got them on {schedule.cache_seqlens.device}, q is on {device}")


def _cache_dtype(k_cache: torch.Tensor, q: torch.Tensor, is_fp8_kvcache: bool, kv_scale: torch.Tensor | None) -> str:
    """The cache's storage name, after the checks FlashMLA's layout rules call for."""
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() not in (3, 4):
        raise MLAInputError(f"k_cache: expected a tensor [num_blocks, page_block_size, 1, d], got {describe(k_cache)}")
    if k_cache.dim() == 4 and k_cache.shape[2] != 1:
        raise MLAInputError(f"k_cache: expected one KV head ([num_blocks, page_block_size, 1, d]: MLA's shared latent), got shape {tuple(k_cache.shape)}")
    if k_cache.dtype not in (torch.bfloat16, torch.float16, FP8_DTYPE):
        raise MLAInputError(f"k_cache: expected dtype bfloat16, float16 or float8_e4m3fn, got {k_cache.dtype}")
    if is_fp8_kvcache and k_cache.shape[-1] * k_cache.element_size() == _PACKED_FP8_ROW_BYTES:
        raise _unsupported(
            "is_fp8_kvcache", f"FlashMLA's packed {_PACKED_FP8_ROW_BYTES}-byte fp8 layout; store a plain float8_e4m3fn cache of "
            f"{q.shape[-1]} columns and pass its scale as kv_scale="
        )
    if k_cache.shape[-1] != q.shape[-1]:
        raise MLAInputError(f"k_cache: expected last dim d = {q.shape[-1]} (q's), got shape {tuple(k_cache.shape)}")
    fp8 = k_cache.dtype == FP8_DTYPE
    if bool(is_fp8_kvcache) != fp8:
        fix = "pass is_fp8_kvcache=True with an fp8 cache" if fp8 else "is_fp8_kvcache=True needs a float8_e4m3fn cache"
        raise MLAInputError(f"is_fp8_kvcache: got {is_fp8_kvcache!r} for a {k_cache.dtype} cache; {fix}")
    if fp8 and kv_scale is None:
        raise MLAInputError("kv_scale: required with an fp8 cache (mlakit's keyword: a float32 per-tensor scale [1] or per-group scales)")
    if fp8 and not isinstance(kv_scale, torch.Tensor):
        raise MLAInputError(
            f"kv_scale: expected a float32 tensor (a per-tensor scale [1] or per-group scales), got {describe(kv_scale)}"
        )
    return storage_name(k_cache.dtype)


def _checked_schedule(tile_scheduler_metadata: object, num_splits: object) -> FlashMLASchedule:
    origin = "the pair from mlakit.compat.flash_mla.get_mla_metadata (metadata from the flash_mla package cannot drive mlakit's kernels)"
    if not isinstance(tile_scheduler_metadata, FlashMLASchedule):
        raise MLAInputError(f"tile_scheduler_metadata: expected the first item of {origin}, got {type(tile_scheduler_metadata).__name__}")
    if num_splits is not None:
        raise MLAInputError(f"num_splits: expected None, the second item of {origin}, got {type(num_splits).__name__}")
    return tile_scheduler_metadata


_SPARSE_ARGUMENTS = ("indices", "attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length")


def _refuse_unsupported(*values: object) -> None:
    """Raises naming the arguments of `_SPARSE_ARGUMENTS` (in that order) that are not None."""
    for value in values:
        if value is not None:
            given = [name for name, given_value in zip(_SPARSE_ARGUMENTS, values) if given_value is not None]
            raise _unsupported(", ".join(given), "sparse attention, attention sinks and extra caches")


def _unsupported(argument: str, what: str) -> MLAInputError:
    return MLAInputError(f"{argument}: not supported by mlakit.compat.flash_mla ({what}); leave it unset")
