"""The two exchanges of decode context parallelism, one of each per layer.

`gather_heads`: every rank of a DCP group gets the group's query heads (all-gather), so
each rank can attend with all of them over its own shard of the cache. `merge_across_ranks`:
the partial results go back to the rank that owns each head (all-to-all of the outputs and
of their log-sum-exps), which merges them exactly with `merge_attention_states`. Both are
single torch.distributed collectives on tensors: NCCL can capture them in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mlakit.errors import MLAInputError
from mlakit.reference import merge_attention_states

# torch >= 2.10 names the single-tensor all-gather all_gather_single (all_gather_into_tensor is deprecated).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """All-gathers `x [..., heads, dim]` along its head axis over `group`: `[..., size * heads, dim]`,
    rank j's heads at `j * heads .. (j + 1) * heads - 1`.

    Single process (a group of one) for the example; a DCP group of 4 turns 16 heads into 64:

    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> gather_heads(torch.ones(3, 16, 576), dist.group.WORLD).shape
    torch.Size([3, 16, 576])
    >>> dist.destroy_process_group()
    """
    if x.dim() < 2:
        raise MLAInputError(f"x: expected a tensor [..., heads, dim], got shape {tuple(x.shape)}")
    size = dist.get_world_size(group)
    gathered = x.new_empty((size * x.shape[0], *x.shape[1:]))  # the concatenated form: gloo takes no other
    _all_gather_single(gathered, x.contiguous(), group=group)
    return gathered.unflatten(0, (size, x.shape[0])).movedim(0, -3).flatten(-3, -2)


def merge_across_ranks(
    out: torch.Tensor, lse: torch.Tensor, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention for this rank's heads from every rank's partial result over its keys.

    Each rank of `group` passes its partial `out [..., heads, dim]` and `lse [..., heads]`
    (natural log; -inf where it saw no key) for the group's gathered heads (the layout of
    `gather_heads`); rank j gets back `out [..., heads / size, dim]` (in out's dtype) and
    `lse [..., heads / size]` (float32) for heads `j * heads / size ..`, merged in float32
    over the ranks in rank order. A query no rank saw a key for gets zeros and -inf.

    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> o, l = merge_across_ranks(torch.ones(2, 4, 8), torch.zeros(2, 4), dist.group.WORLD)
    >>> o.shape, l.shape
    (torch.Size([2, 4, 8]), torch.Size([2, 4]))
    >>> dist.destroy_process_group()
    """
    if out.dim() < 2 or lse.shape != out.shape[:-1]:
        raise MLAInputError(
            f"out, lse: expected out [..., heads, dim] and lse [..., heads] (out's shape without its last axis), "
            f"got {tuple(out.shape)} and {tuple(lse.shape)}"
        )
    size = dist.get_world_size(group)
    heads = out.shape[-2]
    if heads % size:
        raise MLAInputError(f"out: expected a head count divisible by the group's {size} ranks, got {heads} heads")
    # Head block j goes to rank j: move the block axis to the front, where all_to_all_single splits.
    send_out = out.unflatten(-2, (size, heads // size)).movedim(-3, 0).contiguous()
    send_lse = lse.float().unflatten(-1, (size, heads // size)).movedim(-2, 0).contiguous()
    parts_out, parts_lse = torch.empty_like(send_out), torch.empty_like(send_lse)
    dist.all_to_all_single(parts_out, send_out, group=group)
    dist.all_to_all_single(parts_lse, send_lse, group=group)
    merged_out, merged_lse = parts_out[0].float(), parts_lse[0]
    for j in range(1, size):
        merged_out, merged_lse = merge_attention_states(merged_out, merged_lse, parts_out[j].float(), parts_lse[j])
    return merged_out.to(out.dtype), merged_lse
