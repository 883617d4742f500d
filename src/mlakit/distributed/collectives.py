"""The two exchanges of decode context parallelism, one of each per layer.

`gather_heads`: every rank of a DCP group gets the group's query heads (all-gather), so
each rank can attend with all of them over its own shard of the cache. `merge_across_ranks`:
the partial results go back to the rank that owns each head (`exchange_partials`: one
all-to-all of the outputs packed with their log-sum-exps), which merges them exactly. Both are
single torch.distributed collectives on tensors: NCCL can capture them in a CUDA graph.
"""

from __future__ import annotations

import math

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
    to rank j in one all-to-all (one float32 buffer: per rank its block's output rows, then their
    lse); returns what this rank received, `parts [size, ..., heads / size, dim]` (out's dtype)
    and `part_lse [size, ..., heads / size]` (float32), views of that buffer, part r from rank r.

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
    heads = out.shape[-2]
    if heads % size:
        raise MLAInputError(f"out: expected a head count divisible by the group's {size} ranks, got {heads} heads")
    # Head block j goes to rank j: the block axis first, where all_to_all_single splits.
    block = (*out.shape[:-2], heads // size)
    layout = _ExchangeLayout(block, out.shape[-1], out.dtype)
    send = layout.buffer(size, out.device)
    payload, lse_part = layout.views(send)
    payload.copy_(out.unflatten(-2, (size, heads // size)).movedim(-3, 0))
    lse_part.copy_(lse.unflatten(-1, (size, heads // size)).movedim(-2, 0))
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return layout.views(received)


class _ExchangeLayout:
    """One rank's chunk of an exchange buffer: the output rows of a head block `[*block, dim]` as
    float32 words (16-byte aligned rows), then their lse, padded to 16 bytes."""

    def __init__(self, block: tuple[int, ...], dim: int, dtype: torch.dtype) -> None:
        self.block, self.dim, self.dtype = block, dim, dtype
        self.rows = math.prod(block)
        self.words = _round_up(dim * dtype.itemsize, 16) // 4
        self.chunk = self.rows * self.words + _round_up(self.rows, 4)

    def buffer(self, size: int, device: torch.device) -> torch.Tensor:
        return torch.empty(size, self.chunk, dtype=torch.float32, device=device)

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[size, *block, dim]` in the output dtype and `[size, *block]` float32 views of `buffer`."""
        size, payload_words = buffer.shape[0], self.rows * self.words
        payload = buffer[:, :payload_words].view(size, *self.block, self.words).view(self.dtype)[..., :self.dim]
        return payload, buffer[:, payload_words:payload_words + self.rows].view(size, *self.block)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


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
