"""The functional entry point shared by every backend: `mla_decode`."""

from __future__ import annotations

import functools

import torch

from mlakit.checks import check_decode_inputs
from mlakit.config import AUTO
from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError, MLAInputError
from mlakit.kv_quant import STORAGE_DTYPES
from mlakit.reference import pages_view
from mlakit.registry.catalog import all_records, get_backend
from mlakit.registry.fit import Requirements, backend_problems
from mlakit.shape import MLAShape

# Latent widths of the published MLA models: cache dim -> kv_lora_rank.
_KNOWN_LATENT_SPLITS = {576: 512, 288: 256}
_DTYPE_NAMES = {dtype: name for name, dtype in STORAGE_DTYPES.items()}


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MLA decode over a paged latent cache on the chosen backend.

    Shapes: q `[batch, q_len, heads, kv_lora_rank + rope]` (bf16/fp16); kv_cache
    `[num_pages, page_size, kv_lora_rank + rope]` (or with a `[.., 1, ..]` head axis;
    bf16, fp16 or fp8_e4m3 with `kv_scale`); block_table `[batch, max_pages]` int32;
    cache_seqlens `[batch]` int32. Returns out `[batch, q_len, heads, kv_lora_rank]` in
    q's dtype and lse `[batch, heads, q_len]` float32 (natural log), or None for lse when
    `return_lse=False`. With q_len > 1, query i of a length-L sequence sees keys
    `0 .. L - q_len + i`.

    `softmax_scale` defaults to `1/sqrt(q.shape[-1])` (FlashMLA's default); pass the
    model's `MLAShape.softmax_scale`. `kv_lora_rank` defaults to 512 for 576-wide rows
    and 256 for 288-wide rows. Shape, dtype and device are always checked;
    `check_inputs=False` skips the checks that read lengths and page indices (they cost
    a host sync), e.g. inside CUDA-graph capture.

    >>> q = torch.randn(2, 1, 4, 576, dtype=torch.bfloat16)
    >>> cache = torch.randn(8, 16, 576, dtype=torch.bfloat16)
    >>> table = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32)
    >>> out, lse = mla_decode(q, cache, table, torch.tensor([20, 3], dtype=torch.int32), softmax_scale=192**-0.5)
    >>> out.shape, lse.shape
    (torch.Size([2, 1, 4, 512]), torch.Size([2, 4, 1]))
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise MLAInputError(f"q: expected a 4-dimensional tensor [batch, q_len, heads, dim], got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise MLAInputError(f"q: expected dtype bfloat16 or float16, got {q.dtype}")
    dim = q.shape[-1]
    if kv_lora_rank is None:
        if dim not in _KNOWN_LATENT_SPLITS:
            raise MLAInputError(
                f"kv_lora_rank: cannot infer it from q's last dim {dim} (known: {_KNOWN_LATENT_SPLITS}); pass kv_lora_rank="
            )
        kv_lora_rank = _KNOWN_LATENT_SPLITS[dim]
    check_decode_inputs(q, kv_cache, block_table, cache_seqlens, kv_scale, kv_lora_rank, check_values=check_inputs)
    pages = pages_view(kv_cache)
    name = _decode_backend_for(
        backend,
        str(q.device),
        _DTYPE_NAMES[pages.dtype],
        pages.shape[1],
        q.shape[1],
        q.shape[2],
        kv_lora_rank,
        dim - kv_lora_rank,
        return_lse,
    )
    scale = dim**-0.5 if softmax_scale is None else float(softmax_scale)
    out, lse = get_backend(name).decode(
        q, kv_cache, block_table, cache_seqlens, kv_lora_rank=kv_lora_rank, softmax_scale=scale, kv_scale=kv_scale
    )
    return out, (lse if return_lse else None)


@functools.lru_cache(maxsize=256)
def _decode_backend_for(
    backend: str,
    device: str,
    kv_dtype: str,
    page_size: int,
    q_len: int,
    heads: int,
    kv_lora_rank: int,
    rope_dim: int,
    needs_lse: bool,
) -> str:
    """The backend that serves one kind of call (cached: the answer depends only on these)."""
    req = Requirements(
        device=DeviceInfo.detect(device),
        shape=MLAShape(heads, kv_lora_rank, 1, rope_dim, 1),
        page_size=page_size,
        kv_dtype=kv_dtype,
        decode_q_len=q_len,
        needs_lse=needs_lse,
    )
    if backend != AUTO:
        problems = backend_problems(get_backend(backend).record, "decode", req)
        if problems:
            raise ConfigError(f"backend {backend!r} cannot run this decode call: " + "; ".join(problems))
        return backend
    for record in all_records():
        if not backend_problems(record, "decode", req):
            return record.name
    raise ConfigError(f"no registered backend can run this decode call on {device}")
