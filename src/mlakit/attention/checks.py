"""Input checks for attention calls. Errors name the argument, what was expected and what came.

`check_decode_inputs` runs cheap metadata checks (shape, dtype, device) always; with
`check_values=True` it also reads the tensors' values (sequence lengths, page indices),
which costs one host-device synchronisation.
"""

from __future__ import annotations

import math
import numbers

import torch

from mlakit.errors import MLAInputError, is_int
from mlakit.cache.kv_quant import FP8_DTYPE, num_scale_groups
from mlakit.prefill.metadata import PrefillMetadata
from mlakit.reference import pages_view

QUERY_DTYPES = (torch.bfloat16, torch.float16)
CACHE_DTYPES = (torch.bfloat16, torch.float16, FP8_DTYPE)


def _fail(argument: str, expected: str, got: object) -> MLAInputError:
    return MLAInputError(f"{argument}: expected {expected}, got {got}")


def checked_softmax_scale(softmax_scale: object, default: float | None = None) -> float:
    """`softmax_scale` as a float, or `default` when it is None and a default exists.

    A scale must be a finite real number > 0: a model's scale is `1/sqrt(d_nope + d_rope)`,
    times `mscale**2` with YaRN. NaN or inf would poison every output; 0 would make attention
    a plain mean of the values and a negative scale would favour the least similar keys, so
    neither is a model's scale and both are refused rather than computed.

    >>> checked_softmax_scale(None, default=0.125), checked_softmax_scale(2)
    (0.125, 2.0)
    >>> checked_softmax_scale(float("nan"))
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: softmax_scale: expected a finite number > 0, got nan
    """
    if softmax_scale is None and default is not None:
        return default
    if type(softmax_scale) is float and 0 < softmax_scale < math.inf:
        return softmax_scale
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise _fail("softmax_scale", "a finite number > 0 (a Python or NumPy float)", repr(softmax_scale))
    value = float(softmax_scale)
    if not math.isfinite(value) or value <= 0:
        raise _fail("softmax_scale", "a finite number > 0", value)
    return value


def _check_tensor(argument: str, tensor: object, dims: int, dtypes: tuple[torch.dtype, ...], device: torch.device) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise _fail(argument, "a torch.Tensor", type(tensor).__name__)
    if tensor.dim() != dims:
        raise _fail(argument, f"{dims} dimensions", f"shape {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        raise _fail(argument, f"dtype in {[str(d) for d in dtypes]}", tensor.dtype)
    if tensor.device != device:
        raise _fail(argument, f"a tensor on {device} (the device of q)", tensor.device)
    return tensor


def check_output(
    argument: str,
    tensor: torch.Tensor | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    *,
    mergeable: int = 1,
    any_strides: bool = False,
) -> None:
    """Raises MLAInputError unless `tensor` is None or a `shape` tensor of `dtype` on `device` that a
    kernel can write: at any strides with `any_strides`, else with the last dim contiguous (and with
    `mergeable` > 1 draft tokens, its first two dims viewable as one, as in a contiguous tensor).

    >>> check_output("out", torch.empty(2, 4, 3).transpose(1, 2), (2, 3, 4), torch.float32, torch.device("cpu"))
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: out: expected a [2, 3, 4] tensor with a contiguous last dim, got strides (12, 1, 3)
    """
    if tensor is None:
        return
    _check_tensor(argument, tensor, len(shape), (dtype,), device)
    if tuple(tensor.shape) != shape:
        raise _fail(argument, f"shape {list(shape)}", f"shape {tuple(tensor.shape)}")
    if _overlaps_itself(tensor):
        raise _fail(argument, f"a {list(shape)} tensor whose elements are distinct memory (not expanded)",
                    f"strides {tensor.stride()}")
    writable = any_strides or tensor.stride(-1) == 1 and (mergeable == 1 or shape[0] == 1 or tensor.stride(0) == mergeable * tensor.stride(1))
    if not writable:
        raise _fail(argument, f"a {list(shape)} tensor with a contiguous last dim" + (
            " and its first two dims viewable as one" if mergeable > 1 else ""), f"strides {tensor.stride()}")


def _overlaps_itself(tensor: torch.Tensor) -> bool:
    """Whether two elements of `tensor` may share memory: its dims of more than one element, by stride, do not each
    step past the span of the smaller ones (an expanded tensor's stride 0, say).

    >>> _overlaps_itself(torch.empty(2, 1, 3).expand(2, 4, 3)), _overlaps_itself(torch.empty(4, 3).t())
    (True, False)
    """
    span = 1
    for stride, size in sorted((stride, size) for stride, size in zip(tensor.stride(), tensor.shape) if size > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def _check_contiguous_last_dim(argument: str, tensor: torch.Tensor, reason: str) -> None:
    """MLAInputError unless `tensor`'s last dim is contiguous (stride 1) where it holds more than one element: the
    kernels read it as one run of memory (`reason` says what it holds)."""
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise _fail(argument, f"a contiguous last dim (stride 1: {reason})", f"strides {tuple(tensor.stride())}")


def check_metadata_arguments(cache_seqlens: object, heads: object, q_len_name: str, q_len: object,
                             cu_seqlens_q: object = None) -> None:
    """Raises MLAInputError naming the first bad argument of `mla_decode_metadata` (`q_len`) or
    `mla_extend_metadata` (`max_q_len`, `cu_seqlens_q`): their types and shapes only, no values read.

    >>> check_metadata_arguments([20, 3], 4, "q_len", 1)
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: cache_seqlens: expected a torch.Tensor, got list
    """
    if not isinstance(cache_seqlens, torch.Tensor):
        raise _fail("cache_seqlens", "a torch.Tensor", type(cache_seqlens).__name__)
    _check_tensor("cache_seqlens", cache_seqlens, 1, (torch.int32,), cache_seqlens.device)
    if cache_seqlens.shape[0] == 0:
        raise _fail("cache_seqlens", "[batch] lengths with batch >= 1", f"shape {tuple(cache_seqlens.shape)}")
    _check_contiguous_last_dim("cache_seqlens", cache_seqlens, "one length a sequence")
    for name, value in (("heads", heads), (q_len_name, q_len)):
        if not is_int(value) or value < 1:
            raise _fail(name, "an integer >= 1", repr(value))
    if cu_seqlens_q is not None:
        if not isinstance(cu_seqlens_q, torch.Tensor):
            raise _fail("cu_seqlens_q", "a torch.Tensor", type(cu_seqlens_q).__name__)
        _check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,), cache_seqlens.device)
        if cu_seqlens_q.shape[0] != cache_seqlens.shape[0] + 1:
            raise _fail("cu_seqlens_q", f"[{cache_seqlens.shape[0] + 1}] offsets (batch + 1)",
                        f"shape {tuple(cu_seqlens_q.shape)}")
        _check_contiguous_last_dim("cu_seqlens_q", cu_seqlens_q, "the sequences' offsets")


def check_decode_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kv_scale: torch.Tensor | None,
    kv_lora_rank: int,
    *,
    check_values: bool = True,
) -> None:
    """Raises MLAInputError naming the first bad argument of an `mla_decode` call.

    >>> check_decode_inputs(torch.randn(1, 1, 2, 576).bfloat16(), torch.randn(2, 64, 576).bfloat16(),
    ...     torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int32), None, 512)
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: block_table: expected dtype in ['torch.int32'], got torch.int64
    """
    if not isinstance(q, torch.Tensor):
        raise _fail("q", "a torch.Tensor", type(q).__name__)
    _check_tensor("q", q, 4, QUERY_DTYPES, q.device)
    batch, q_len, heads, dim = q.shape
    if batch == 0 or q_len == 0 or heads == 0:
        raise _fail("q", "[batch, q_len, heads, dim] with batch, q_len and heads >= 1", f"shape {tuple(q.shape)}")
    _check_paged_operands(q, kv_cache, block_table, cache_seqlens, kv_scale, kv_lora_rank, batch, check_values)


def check_extend_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_q_len: int,
    kv_scale: torch.Tensor | None,
    kv_lora_rank: int,
    *,
    check_values: bool = True,
) -> None:
    """Raises MLAInputError naming the first bad argument of an `mla_extend` call.

    >>> check_extend_inputs(torch.randn(3, 2, 576).bfloat16(), torch.randn(2, 64, 576).bfloat16(),
    ...     torch.zeros(1, 1, dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
    ...     torch.tensor([0, 2], dtype=torch.int32), 3, None, 512)
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: cu_seqlens_q: expected the last offset to equal q's 3 tokens, got 2
    """
    if not isinstance(q, torch.Tensor):
        raise _fail("q", "a torch.Tensor", type(q).__name__)
    _check_tensor("q", q, 3, QUERY_DTYPES, q.device)
    if q.shape[1] == 0:
        raise _fail("q", "[tokens, heads, dim] with heads >= 1", f"shape {tuple(q.shape)}")
    _check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,), q.device)
    if cu_seqlens_q.shape[0] < 2:
        raise _fail("cu_seqlens_q", "[batch + 1] offsets with batch >= 1", f"shape {tuple(cu_seqlens_q.shape)}")
    _check_contiguous_last_dim("cu_seqlens_q", cu_seqlens_q, "the sequences' offsets")
    if not is_int(max_q_len) or max_q_len < 1:
        raise _fail("max_q_len", "an integer >= 1 (the most new tokens of any sequence)", repr(max_q_len))
    batch = cu_seqlens_q.shape[0] - 1
    if isinstance(block_table, torch.Tensor) and block_table.dim() == 2 and block_table.shape[0] != batch:
        raise _fail(
            "cu_seqlens_q", f"{block_table.shape[0] + 1} offsets (batch + 1, block_table has {block_table.shape[0]} rows)",
            f"shape {tuple(cu_seqlens_q.shape)}",
        )
    _check_paged_operands(q, kv_cache, block_table, cache_seqlens, kv_scale, kv_lora_rank, batch, check_values)
    if check_values:
        offsets = cu_seqlens_q.long()
        new = offsets[1:] - offsets[:-1]
        first, last, shortest, longest, beyond = torch.stack(
            [offsets[0], offsets[-1], new.min(), new.max(), (new > cache_seqlens.long()).sum()]
        ).tolist()
        if first != 0:
            raise _fail("cu_seqlens_q", "offsets starting at 0", f"first offset {first}")
        if last != q.shape[0]:
            raise _fail("cu_seqlens_q", f"the last offset to equal q's {q.shape[0]} tokens", last)
        if shortest < 0:
            raise _fail("cu_seqlens_q", "non-decreasing offsets", cu_seqlens_q.tolist())
        if longest > max_q_len:
            raise _fail("max_q_len", f">= the longest segment ({longest} new tokens)", max_q_len)
        if beyond:
            raise _fail("cache_seqlens", "each length >= its segment's new tokens (they are already in the cache)", cache_seqlens.tolist())


def check_cache_operand(q: torch.Tensor, kv_cache: object, kv_lora_rank: object) -> torch.Tensor:
    """Raises MLAInputError naming `kv_lora_rank` or `kv_cache` unless the cache suits the checked query `q` (a
    tensor `[num_pages, page_size, dim]` or `[num_pages, page_size, 1, dim]` of a cache dtype on q's device, q's last
    dim, at least one page of one token, each token's values contiguous) and the latent width leaves a rope part;
    returns the cache's `[num_pages, page_size, dim]` view."""
    dim = q.shape[-1]
    if not is_int(kv_lora_rank) or not 0 < kv_lora_rank < dim:
        raise _fail("kv_lora_rank", f"an integer in 1..{dim - 1} (q's last dim is {dim} = latent + rope)", repr(kv_lora_rank))
    if not isinstance(kv_cache, torch.Tensor):
        raise _fail("kv_cache", "a torch.Tensor", type(kv_cache).__name__)
    if kv_cache.dim() == 4 and kv_cache.shape[2] != 1:
        raise _fail("kv_cache", "[num_pages, page_size, dim] or [num_pages, page_size, 1, dim]", f"shape {tuple(kv_cache.shape)}")
    pages = _check_tensor("kv_cache", pages_view(kv_cache), 3, CACHE_DTYPES, q.device)
    num_pages, page_size, cache_dim = pages.shape
    if cache_dim != dim:
        raise _fail("kv_cache", f"last dim {dim} (the last dim of q)", f"shape {tuple(kv_cache.shape)}")
    if num_pages == 0 or page_size == 0:
        raise _fail("kv_cache", "at least one page of at least one token", f"shape {tuple(kv_cache.shape)}")
    _check_contiguous_last_dim("kv_cache", pages, "a token's latent and rope values")
    return pages


def _check_paged_operands(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kv_scale: torch.Tensor | None,
    kv_lora_rank: int,
    batch: int,
    check_values: bool,
) -> None:
    device = q.device
    pages = check_cache_operand(q, kv_cache, kv_lora_rank)
    num_pages, page_size, _ = pages.shape
    _check_tensor("block_table", block_table, 2, (torch.int32,), device)
    if block_table.shape[0] != batch:
        raise _fail("block_table", f"shape [{batch}, max_pages] (batch of q)", f"shape {tuple(block_table.shape)}")
    _check_tensor("cache_seqlens", cache_seqlens, 1, (torch.int32,), device)
    _check_contiguous_last_dim("block_table", block_table, "a sequence's page indices")
    if cache_seqlens.shape[0] != batch:
        raise _fail("cache_seqlens", f"shape [{batch}] (batch of q)", f"shape {tuple(cache_seqlens.shape)}")
    _check_contiguous_last_dim("cache_seqlens", cache_seqlens, "one length a sequence")

    _check_kv_scale(kv_scale, pages, device)
    if check_values:
        check_lengths_and_pages(block_table, cache_seqlens, page_size, num_pages, kv_scale)


def _check_kv_scale(kv_scale: torch.Tensor | None, pages: torch.Tensor, device: torch.device) -> None:
    num_pages, page_size, dim = pages.shape
    if pages.dtype != FP8_DTYPE:
        if kv_scale is not None:
            raise _fail("kv_scale", f"None for a {pages.dtype} cache (scales apply to fp8 caches only)", "a tensor")
        return
    if kv_scale is None:
        raise _fail("kv_scale", "a float32 scale for the fp8 cache (one element, or [num_pages, page_size, groups])", None)
    if not isinstance(kv_scale, torch.Tensor) or kv_scale.dtype != torch.float32:
        raise _fail("kv_scale", "a float32 tensor", getattr(kv_scale, "dtype", type(kv_scale).__name__))
    if kv_scale.device != device:
        raise _fail("kv_scale", f"a tensor on {device} (the device of q)", kv_scale.device)
    per_group = (num_pages, page_size, num_scale_groups(dim))
    if kv_scale.numel() != 1 and tuple(kv_scale.shape) != per_group:
        raise _fail("kv_scale", f"one element or shape {list(per_group)}", f"shape {tuple(kv_scale.shape)}")


def _scale_problems(kv_scale: torch.Tensor | None) -> list[torch.Tensor]:
    """For a per-tensor fp8 scale, [whether it is not a finite number > 0] as a device bool, to read with the other
    value checks in one host sync; [] otherwise (per-group scales of unwritten slots may hold anything)."""
    if kv_scale is None or kv_scale.numel() != 1:
        return []
    return [~(torch.isfinite(kv_scale) & (kv_scale > 0)).all()]


def _scale_failure(kv_scale: torch.Tensor) -> MLAInputError:
    return _fail("kv_scale", "a finite scale > 0 (the fp8 cache's values times it are the latent)",
                 float(kv_scale.reshape(())))


def check_lengths_and_pages(block_table: torch.Tensor, cache_seqlens: torch.Tensor, page_size: int, num_pages: int,
                             kv_scale: torch.Tensor | None = None) -> None:
    """The values `_check_paged_operands` reads, in one host sync: lengths, the page indices they use and a
    per-tensor fp8 scale (`_scale_problems`)."""
    max_pages = block_table.shape[1]
    lengths = cache_seqlens.long()
    pages_needed = (lengths + page_size - 1) // page_size
    page_used = torch.arange(max_pages, device=block_table.device)[None, :] < pages_needed[:, None]
    bad_page = page_used & ((block_table < 0) | (block_table >= num_pages))
    problems = [(lengths < 0).any(), (lengths > max_pages * page_size).any(), bad_page.any()]
    negative, too_long, out_of_range, *scale_unusable = torch.stack(problems + _scale_problems(kv_scale)).tolist()
    if any(scale_unusable):
        raise _scale_failure(kv_scale)
    if negative:
        b = int(torch.nonzero(lengths < 0)[0])
        raise _fail("cache_seqlens", "lengths >= 0", f"cache_seqlens[{b}] = {int(lengths[b])}")
    if too_long:
        b = int(torch.nonzero(lengths > max_pages * page_size)[0])
        raise _fail(
            "cache_seqlens",
            f"lengths <= max_pages * page_size = {max_pages} * {page_size} = {max_pages * page_size} "
            "(a sequence longer than its pages)",
            f"cache_seqlens[{b}] = {int(lengths[b])}",
        )
    if out_of_range:
        b, p = (int(i) for i in torch.nonzero(bad_page)[0])
        raise _fail(
            "block_table",
            f"page indices in [0, {num_pages}) for the {int(pages_needed[b])} pages sequence {b} uses",
            f"block_table[{b}, {p}] = {int(block_table[b, p])}",
        )


def check_prefill_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_b_weight: torch.Tensor,
    meta: PrefillMetadata,
    kv_scale: torch.Tensor | None,
    *,
    query_dtypes: tuple[torch.dtype, ...] = QUERY_DTYPES,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    check_values: bool = True,
) -> None:
    """Raises MLAInputError naming the first bad argument of an `mla_prefill` call (`out` and `lse`: the
    caller's outputs, `[T, heads, d_v]` in q's dtype and `[T, heads]` float32, last dims contiguous).

    >>> from mlakit.prefill.metadata import plan_prefill
    >>> table = torch.zeros(1, 1, dtype=torch.int32)
    >>> check_prefill_inputs(torch.randn(2, 4, 192).bfloat16(), torch.randn(2, 64, 576).bfloat16(),
    ...     torch.randn(4 * 256, 512).bfloat16(), plan_prefill([3], [3], table, 64), None)
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: q: expected 3 tokens (the prefill metadata's new tokens), got shape (2, 4, 192)
    """
    _check_tensor("q", q, 3, query_dtypes, q.device if isinstance(q, torch.Tensor) else torch.device("cpu"))
    if not isinstance(meta, PrefillMetadata):
        raise _fail("meta", "a PrefillMetadata (from plan_prefill)", type(meta).__name__)
    if not isinstance(kv_cache, torch.Tensor):
        raise _fail("kv_cache", "a torch.Tensor", type(kv_cache).__name__)
    tokens, heads, qk_dim = q.shape
    if tokens != meta.queries.total:
        raise _fail("q", f"{meta.queries.total} tokens (the prefill metadata's new tokens)", f"shape {tuple(q.shape)}")
    if heads == 0:
        raise _fail("q", "[tokens, heads, d_nope + d_rope] with heads >= 1", f"shape {tuple(q.shape)}")
    if kv_cache.dim() == 4 and kv_cache.shape[2] != 1:
        raise _fail("kv_cache", "[num_pages, page_size, dim] or [num_pages, page_size, 1, dim]", f"shape {tuple(kv_cache.shape)}")
    _check_contiguous_last_dim("q", q, "a token's query values for a head")
    pages = _check_tensor("kv_cache", pages_view(kv_cache), 3, (*CACHE_DTYPES, torch.float32), q.device)
    num_pages, page_size, cache_dim = pages.shape
    _check_contiguous_last_dim("kv_cache", pages, "a token's latent and rope values")
    if page_size != meta.page_size:
        raise _fail("kv_cache", f"pages of {meta.page_size} tokens (the page size the metadata was planned for)", f"shape {tuple(kv_cache.shape)}")
    _check_tensor("kv_b_weight", kv_b_weight, 2, (torch.bfloat16, torch.float16, torch.float32), q.device)
    rows, rank = kv_b_weight.shape
    rope_dim = cache_dim - rank
    nope_dim = qk_dim - rope_dim
    if rope_dim < 1 or nope_dim < 1:
        raise _fail(
            "kv_b_weight",
            f"[heads * (d_nope + d_v), kv_lora_rank] with kv_lora_rank < the cache's row width {cache_dim} - d_rope and "
            f"q's last dim {qk_dim} = d_nope + d_rope",
            f"shape {tuple(kv_b_weight.shape)}",
        )
    if rows % heads or rows // heads <= nope_dim:
        raise _fail("kv_b_weight", f"{heads} heads x (d_nope {nope_dim} + d_v) rows", f"shape {tuple(kv_b_weight.shape)}")
    _check_kv_scale(kv_scale, pages, q.device)
    check_output("out", out, (tokens, heads, rows // heads - nope_dim), q.dtype, q.device)
    check_output("lse", lse, (tokens, heads), torch.float32, q.device)
    if meta.queries.cu_seqlens.device != q.device:
        raise _fail("meta", f"prefill metadata planned on {q.device} (the device of q)", meta.queries.cu_seqlens.device)
    if check_values:
        slots = torch.cat([keys.slots for keys, _ in meta.passes])
        out_of_range = ((slots < 0) | (slots >= num_pages * page_size)).any()
        slots_bad, *scale_unusable = torch.stack([out_of_range.to(q.device), *_scale_problems(kv_scale)]).tolist()
        if any(scale_unusable):
            raise _scale_failure(kv_scale)
        if slots_bad:
            raise _fail(
                "block_table",
                f"page indices in [0, {num_pages}) for every page the prefill reads (as planned by plan_prefill)",
                "an index out of range",
            )
