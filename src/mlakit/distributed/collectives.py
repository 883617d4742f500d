"""The two exchanges of decode context parallelism, one of each per layer.

`gather_heads`: every rank of a DCP group gets the group's query heads (all-gather), so
each rank can attend with all of them over its own shard of the cache. `merge_across_ranks`:
the partial results go back to the rank that owns each head (`exchange_partials`: one
all-to-all of the outputs packed with their log-sum-exps), which merges them exactly. Both are
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


def exchange_partials(
    out: torch.Tensor, lse: torch.Tensor, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sends head block j of every rank's partial `out [..., heads, dim]` and `lse [..., heads]`
    to rank j in one all-to-all (each row's output and its float32 lse packed side by side in
    one float32 buffer); returns what this rank received, `parts [size, ..., heads / size, dim]`
    (out's dtype) and `part_lse [size, ..., heads / size]` (float32), views of that buffer,
    part r from rank r.

    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> parts, part_lse = exchange_partials(torch.ones(2, 4, 8), torch.zeros(2, 4), dist.group.WORLD)
    >>> parts.shape, part_lse.shape
    (torch.Size([1, 2, 4, 8]), torch.Size([1, 2, 4]))
    >>> dist.destroy_process_group()
    """
    if out.dim() < 2 or lse.shape != out.shape[:-1]:
        raise MLAInputError(
            f"out, lse: expected out [..., heads, dim] and lse [..., heads] (out's shape without its last axis), "
            f"got {tuple(out.shape)} and {tuple(lse.shape)}"
        )
    size = dist.get_world_size(group)
    heads, dim = out.shape[-2:]
    if heads % size:
        raise MLAInputError(f"out: expected a head count divisible by the group's {size} ranks, got {heads} heads")
    # Head block j goes to rank j: the block axis first, where all_to_all_single splits.
    blocks = (*out.shape[:-2], size, heads // size)
    words = -(-dim * out.element_size() // 4)
    send = torch.empty((size, *blocks[:-2], heads // size, words + 1), dtype=torch.float32, device=out.device)
    _payload(send, out.dtype, dim).copy_(out.unflatten(-2, blocks[-2:]).movedim(-3, 0))
    send[..., words].copy_(lse.unflatten(-1, blocks[-2:]).movedim(-2, 0))
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return _payload(received, out.dtype, dim), received[..., words]


def _payload(buffer: torch.Tensor, dtype: torch.dtype, dim: int) -> torch.Tensor:
    """The output rows of an exchange buffer (all but its last float32 word per row) as `dtype`."""
    return buffer[..., :-1].view(dtype)[..., :dim]


def merge_across_ranks(
    out: torch.Tensor, lse: torch.Tensor, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention for this rank's heads from every rank's partial result over its keys.

    Each rank of `group` passes its partial `out [..., heads, dim]` and `lse [..., heads]`
    (natural log; -inf where it saw no key) for the group's gathered heads (the layout of
    `gather_heads`); rank j gets back `out [..., heads / size, dim]` (in out's dtype) and
    `lse [..., heads / size]` (float32) for heads `j * heads / size ..`, merged in float32
    (`exchange_partials`, then one Triton kernel on GPUs, `merge_attention_states` in rank
    order elsewhere). A query no rank saw a key for gets zeros and -inf.

    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> o, l = merge_across_ranks(torch.ones(2, 4, 8), torch.zeros(2, 4), dist.group.WORLD)
    >>> o.shape, l.shape
    (torch.Size([2, 4, 8]), torch.Size([2, 4]))
    >>> dist.destroy_process_group()
    """
    parts, part_lse = exchange_partials(out, lse, group)
    if parts.is_cuda:
        from mlakit.kernels.rank_merge import merge_partials  # needs triton, which CPU-only installs may lack

        merged_out, merged_lse = merge_partials(parts.flatten(1, -2), part_lse.flatten(1), out.dtype)
        return merged_out.view(parts.shape[1:]), merged_lse.view(part_lse.shape[1:])
    merged_out, merged_lse = parts[0].float(), part_lse[0]
    for j in range(1, parts.shape[0]):
        merged_out, merged_lse = merge_attention_states(merged_out, merged_lse, parts[j].float(), part_lse[j])
    return merged_out.to(out.dtype), merged_lse
