"""Small conversions vendor kernels need from mlakit's tensors (shared by the adapters)."""

from __future__ import annotations

import math

import torch

from mlakit.errors import MLAInputError
from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.reference import pages_view
from mlakit.registry.records import BackendRecord, WorkspaceInputs
from mlakit.device import DeviceInfo
from mlakit.shape import MLAShape
from mlakit.workspace import default_pool

MIB = 1 << 20


def per_tensor_scale(backend: str, kv_cache: torch.Tensor, kv_scale: torch.Tensor | None) -> float:
    """The fp8 cache's single scale as a Python float (1.0 for bf16/fp16 caches).

    Reading it costs a host sync once per call; vendor kernels take the scale as a float.
    """
    if pages_view(kv_cache).dtype != FP8_DTYPE:
        return 1.0
    if kv_scale is None or kv_scale.numel() != 1:
        raise MLAInputError(
            f"kv_scale: backend {backend!r} takes one per-tensor fp8 scale, got "
            f"{'None' if kv_scale is None else f'shape {tuple(kv_scale.shape)}'}; "
            "use a cache with per-tensor scales or a backend that takes per-group scales"
        )
    return float(kv_scale.reshape(()).item())


def query_for_cache(q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    """The query in the cache's dtype when the cache is fp8 (query scale 1), else unchanged."""
    if pages_view(kv_cache).dtype == FP8_DTYPE:
        return q.to(FP8_DTYPE)
    return q


def pad_block_table(block_table: torch.Tensor, page_size: int, tokens_per_block: int = 128) -> torch.Tensor:
    """Pads the page table with page 0 so its width holds whole `tokens_per_block` blocks,
    as trtllm-gen and the XPU kernel require (the padding is never read past a sequence's end)."""
    multiple = max(1, tokens_per_block // page_size)
    width = block_table.shape[1]
    padded = math.ceil(width / multiple) * multiple
    if padded == width:
        return block_table
    return torch.nn.functional.pad(block_table, (0, padded - width), value=0)


def decode_workspace(record: BackendRecord, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, kv_lora_rank: int) -> torch.Tensor:
    """The backend's workspace from the default pool, sized by its record for this call."""
    assert record.workspace is not None
    batch, q_len, heads, dim = q.shape
    page_size = pages_view(kv_cache).shape[1]
    inputs = WorkspaceInputs(
        shape=MLAShape.of_latent(heads, kv_lora_rank, dim - kv_lora_rank),
        device=DeviceInfo.detect(q.device),
        page_size=page_size,
        max_batch_size=batch,
        max_context_len=block_table.shape[1] * page_size,
        decode_q_len=q_len,
    )
    spec = record.workspace
    return default_pool().get(spec.family, q.device, spec.size_bytes(inputs), zero_filled=spec.zero_filled)
