"""One layer's MLA attention under decode context parallelism (decode, speculative verify, extend).

Each rank of a DCP group caches a shard of every sequence's tokens (`TokenSharding`) and
holds its TP share of the query heads. Per layer: gather the group's query heads
(all-gather), attend with all of them over the rank's shard (one single-token row per query
token, each with its own visible length from `DCPStep`, so causal masking follows global
positions), then send every head's partial (out, lse) to the rank that owns the head
(all-to-all) and merge them there by their log-sum-exps. The result equals one process's
attention over the whole cache, up to float rounding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mlakit.attention.checks import checked_softmax_scale
from mlakit.attention.functional import DecodeMetadata, mla_decode
from mlakit.config import AUTO
from mlakit.distributed.collectives import gather_heads, merge_across_ranks
from mlakit.distributed.step import DCPStep
from mlakit.errors import MLAInputError
from mlakit.serving.forward import (absorb_query, absorbed_weights, check_absorbed_operands, expand_output,
                                    query_dtype_for)
from mlakit.reference import attend_tokens, pages_view


def dcp_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    step: DCPStep,
    group: dist.ProcessGroup,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    backend: str = AUTO,
    kv_scale: torch.Tensor | None = None,
    check_inputs: bool = True,
    metadata: DecodeMetadata | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of this rank's query heads over the DCP group's sharded cache.

    `q [tokens, heads, kv_lora_rank + rope]`: this rank's heads of the step's query tokens in
    the step's packed order (a decode batch `[batch, q_len, heads, dim]` flattened to
    `[batch * q_len, heads, dim]`); `kv_cache`: this rank's cache, the step's new tokens already
    written at `step.slots`; `group`: the DCP group (`ParallelGroups.dcp_group`). Returns out
    `[tokens, heads, kv_lora_rank]` in q's dtype and lse `[tokens, heads]` float32. Every rank
    of the group must call it for the same step (it runs two collectives). The local attention
    is `mla_decode` with q_len 1 on `backend` (bf16/fp16 queries; `metadata` from
    `mla_decode_metadata(step.visible, q_len=1, heads=heads * group size, ...)` saves rebuilding
    it per layer); a float32 cache (exact reference runs) goes through the torch oracle.

    With one rank the group is the whole cache, so this is plain attention:

    >>> import torch.distributed as dist
    >>> from mlakit.distributed import TokenSharding, dcp_decode_step
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> step = dcp_decode_step(TokenSharding(1), 0, torch.tensor([[1, 0]], dtype=torch.int32),
    ...     torch.tensor([20], dtype=torch.int32), q_len=1, page_size=16)
    >>> out, lse = dcp_attention(torch.randn(1, 4, 576), torch.randn(2, 16, 576), step, dist.group.WORLD,
    ...     kv_lora_rank=512, softmax_scale=192**-0.5)
    >>> out.shape, lse.shape
    (torch.Size([1, 4, 512]), torch.Size([1, 4]))
    >>> dist.destroy_process_group()
    """
    size = dist.get_world_size(group)
    if size != step.sharding.dcp_size or dist.get_rank(group) != step.rank:
        raise MLAInputError(
            f"group: expected the DCP group of the step (rank {step.rank} of {step.sharding.dcp_size}), "
            f"got rank {dist.get_rank(group)} of a group of {size}"
        )
    if q.dim() != 3 or q.shape[0] != step.num_tokens:
        raise MLAInputError(f"q: expected [{step.num_tokens} (the step's query tokens), heads, dim], got {tuple(q.shape)}")
    scale = checked_softmax_scale(softmax_scale)
    group_q = gather_heads(q, group)
    if pages_view(kv_cache).dtype == torch.float32:
        rows = torch.arange(step.num_tokens, device=q.device)
        out, lse = attend_tokens(group_q, kv_cache, step.block_table, rows, step.visible,
                                 kv_lora_rank=kv_lora_rank, softmax_scale=scale, kv_scale=kv_scale)
    else:
        out, lse = mla_decode(
            group_q.unsqueeze(1), kv_cache, step.block_table, step.visible, softmax_scale=scale, backend=backend,
            kv_scale=kv_scale, kv_lora_rank=kv_lora_rank, check_inputs=check_inputs, metadata=metadata,
        )
        out, lse = out.squeeze(1), lse.squeeze(-1)
    out, lse = merge_across_ranks(out, lse, group)
    return out.to(q.dtype), lse


def dcp_mla_forward(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_scale: torch.Tensor | None,
    kv_b_weight: torch.Tensor,
    step: DCPStep,
    group: dist.ProcessGroup,
    *,
    softmax_scale: float,
    backend: str = AUTO,
) -> torch.Tensor:
    """`mlakit.serving.forward.mla_forward` under decode context parallelism: attention output
    `[T, heads, d_v]` (float32) of this rank's heads for the step's query tokens, whose latent
    rows this rank already wrote where it owns them (`step.slots`).

    Every query token runs in the latent form (W_UK absorbed into the query, `dcp_attention`
    over the group's shards, W_UV applied to its output), prefill and extend included: one exact
    path for every kind of step. With one rank it equals `mla_forward`:

    >>> import torch.distributed as dist
    >>> from mlakit.distributed import TokenSharding, dcp_decode_step
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> step = dcp_decode_step(TokenSharding(1), 0, torch.tensor([[0]], dtype=torch.int32),
    ...     torch.tensor([5], dtype=torch.int32), q_len=1, page_size=8)
    >>> dcp_mla_forward(torch.randn(1, 2, 16), torch.randn(1, 2, 16), torch.randn(1, 8, 48), None,
    ...     torch.randn(2 * (16 + 8), 32), step, dist.group.WORLD, softmax_scale=0.2).shape
    torch.Size([1, 2, 8])
    >>> dist.destroy_process_group()
    """
    if not isinstance(kv_cache, torch.Tensor):
        raise MLAInputError(f"kv_cache: expected a torch.Tensor, got {type(kv_cache).__name__}")
    check_absorbed_operands(q_nope, q_pe, kv_cache, kv_b_weight, step.positions.shape[0])
    w_uk, w_uv = absorbed_weights(kv_b_weight, q_nope)
    q_latent = absorb_query(q_nope, q_pe, w_uk).to(query_dtype_for(kv_cache))
    out_latent, _ = dcp_attention(q_latent, kv_cache, step, group, kv_lora_rank=kv_b_weight.shape[1],
                                  softmax_scale=softmax_scale, backend=backend, kv_scale=kv_scale)
    return expand_output(out_latent, w_uv)
