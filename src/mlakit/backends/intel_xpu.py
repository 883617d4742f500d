"""Adapter for sgl_kernel's flash_mla_decode on Intel XPU (decode only, page 16-128, q_len 1)."""

from __future__ import annotations

import torch

from mlakit.backends.vendor_inputs import pad_block_table
from mlakit.reference import pages_view
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule, WorkspaceInputs, WorkspaceSpec
from mlakit.workspace import default_pool

MAX_KV_SPLITS = 64


def _workspace_bytes(inputs: WorkspaceInputs) -> int:
    splits = min(MAX_KV_SPLITS, -(-inputs.max_context_len // inputs.page_size))
    return inputs.max_batch_size * inputs.shape.num_heads * splits * (inputs.shape.kv_lora_rank + 1) * 4


RECORD = BackendRecord(
    name="intel_xpu",
    summary="sgl_kernel flash_mla_decode on Intel XPU",
    phases=frozenset({"decode"}),
    device_kinds=frozenset({"xpu"}),
    page_sizes=PageSizeRule(sizes=frozenset({16, 32, 64, 128})),
    kv_dtypes=frozenset({"bf16", "fp16"}),
    max_decode_q_len=1,
    tree_drafts=False,  # no speculative decoding at all
    max_heads=128,
    kv_lora_ranks=frozenset({512}),
    rope_dims=frozenset({64}),
    packages=("sgl_kernel",),
    install_hint="install sgl-kernel-xpu (github.com/sgl-project/sgl-kernel-xpu)",
    cuda_graphs=False,
    returns_lse=False,
    auto_rank=10,
    preferred_page_size=64,
    workspace=WorkspaceSpec(
        family="intel_xpu",
        formula=(
            f"max_batch x heads_per_rank x min({MAX_KV_SPLITS}, ceil(max_context / page_size)) x "
            "(kv_lora_rank + 1) x 4 bytes (planning estimate; calls ask sgl_kernel.flash_mla_get_workspace_size)"
        ),
        size_bytes=_workspace_bytes,
    ),
    verified="not run here: needs an Intel XPU",
)


def decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, None]:
    """`flash_mla_decode` with the workspace size the kernel library itself asks for."""
    from sgl_kernel import flash_mla_decode, flash_mla_get_workspace_size

    batch, _, heads, _ = q.shape
    pages = pages_view(kv_cache)
    page_size = pages.shape[1]
    nbytes = flash_mla_get_workspace_size(
        max_seq_len=block_table.shape[1] * page_size, num_batches=batch, num_heads=heads, page_size=page_size, num_kv_splits=-1
    )
    workspace = default_pool().get(RECORD.workspace.family, q.device, nbytes)
    flat_q = q[:, 0]
    out = flash_mla_decode(
        flat_q[..., :kv_lora_rank], flat_q[..., kv_lora_rank:], pages, cache_seqlens,
        pad_block_table(block_table, page_size), workspace, softmax_scale,
    )
    return out.unsqueeze(1), None


register(RECORD, decode)
