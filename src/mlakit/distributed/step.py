"""Per-step metadata of one DCP rank: what its cache holds and what each query token sees there.

Built once per step from the global lengths and this rank's page table, with tensor ops on
their device (no host sync, so it can be built inside a captured CUDA graph), and shared
by every layer.

Causality under sharding: query token i of a sequence of L tokens (the step's n new tokens
included) sees global positions `0 .. L - n + i`. On a rank these are the first
`local_length(L - n + i + 1)` of its tokens, a count that grows by 0 or 1 from one query
token to the next, where the kernels' causal rule (query i sees `C - n + i + 1` keys) grows
by exactly 1. So every query token runs as its own single-token row, with its own visible
length: a decode call with q_len 1 on every backend.
"""

from __future__ import annotations

import dataclasses

import torch

from mlakit.distributed.ownership import TokenSharding
from mlakit.errors import MLAInputError, is_int


@dataclasses.dataclass(frozen=True)
class DCPStep:
    """One step seen from DCP rank `rank`; the query tokens are the step's new tokens, packed in
    sequence order.

    - `cache_seqlens [batch]` int32: the tokens of each sequence this rank holds after the step's writes;
    - `positions [tokens]` int64: each query token's global position;
    - `block_table [tokens, max_pages]` int32: this rank's page-table row of each query token's sequence;
    - `visible [tokens]` int32: how many of the rank's tokens of that sequence the query token sees
      (0 where the rank holds none it may see);
    - `slots [tokens]` int64: this rank's cache slot of each new token, -1 where another rank owns
      it (cache writes skip -1), e.g. `cache.layer(i).write_slots(step.slots, rows)`;
    - `cu_seqlens_q [batch + 1]` int32: the offsets of each sequence's query tokens (a model picks
      each sequence's last token at `cu_seqlens_q[1:] - 1`).
    """

    sharding: TokenSharding
    rank: int
    cache_seqlens: torch.Tensor
    positions: torch.Tensor
    block_table: torch.Tensor
    visible: torch.Tensor
    slots: torch.Tensor
    cu_seqlens_q: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


def dcp_step(
    sharding: TokenSharding,
    rank: int,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    num_tokens: int,
    page_size: int,
) -> DCPStep:
    """The step's metadata on DCP rank `rank` of `sharding`.

    `block_table [batch, max_pages]` int32 is this rank's page table (the pages of its own
    tokens); `cache_seqlens [batch]` int32 the GLOBAL lengths after this step's writes;
    `cu_seqlens_q [batch + 1]` int32 the offsets of each sequence's new tokens (`mla_extend`'s);
    `num_tokens` their total, a host int (the scheduler's). The new tokens are the last of each
    sequence, as in `mla_extend`.

    >>> sharding = TokenSharding(dcp_size=2)
    >>> step = dcp_step(sharding, 1, torch.tensor([[3, 5]], dtype=torch.int32), torch.tensor([7], dtype=torch.int32),
    ...     torch.tensor([0, 3], dtype=torch.int32), num_tokens=3, page_size=2)
    >>> step.positions.tolist(), step.visible.tolist(), step.slots.tolist(), step.cache_seqlens.tolist()
    ([4, 5, 6], [2, 3, 3], [-1, 10, -1], [3])
    """
    _check_step_inputs(block_table, cache_seqlens, cu_seqlens_q, num_tokens, page_size)
    if block_table.device.type == "cpu":  # host values: checking them costs no sync (on a GPU it would)
        _check_step_values(sharding, rank, block_table, cache_seqlens, cu_seqlens_q, num_tokens, page_size)
    device = block_table.device
    starts = cu_seqlens_q.long()
    new_counts = starts[1:] - starts[:-1]
    token_seq = torch.arange(new_counts.numel(), device=device).repeat_interleave(new_counts, output_size=num_tokens)
    positions = cache_seqlens.long()[token_seq] - new_counts[token_seq] + torch.arange(num_tokens, device=device) - starts[token_seq]
    # A sequence shorter than its new tokens (a query that sees no key, as mla_decode allows) gives
    # negative positions: they see nothing and are written nowhere.
    in_cache = positions >= 0
    owner, local = sharding.owner(positions.clamp(min=0))
    table = block_table[token_seq]
    # The clamp keeps the gather in range: another rank's token may lie past this rank's pages (its slot is -1
    # anyway), and so may this rank's own where a length outran the table, which only host tensors are checked for
    # (above): its slot is -1 too, never another token's, and the decode's length check refuses the step.
    page = (local // page_size).clamp(max=block_table.shape[1] - 1)
    in_table = local // page_size < block_table.shape[1]
    slots = table.gather(1, page[:, None])[:, 0].long() * page_size + local % page_size
    return DCPStep(
        sharding=sharding,
        rank=rank,
        cache_seqlens=sharding.local_length(cache_seqlens, rank),
        positions=positions,
        block_table=table,
        visible=sharding.local_length((positions + 1).clamp(min=0), rank).int(),
        slots=torch.where((owner == rank) & in_cache & in_table, slots, -1),
        cu_seqlens_q=cu_seqlens_q,
    )


def dcp_decode_step(
    sharding: TokenSharding, rank: int, block_table: torch.Tensor, cache_seqlens: torch.Tensor, *, q_len: int, page_size: int
) -> DCPStep:
    """`dcp_step` for a decode batch: `q_len` new tokens per sequence (1, or k + 1 when verifying k drafts).

    >>> step = dcp_decode_step(TokenSharding(dcp_size=2), 0, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
    ...     torch.tensor([5, 2], dtype=torch.int32), q_len=2, page_size=2)
    >>> step.positions.tolist(), step.visible.tolist(), step.slots.tolist()
    ([3, 4, 0, 1], [2, 3, 1, 1], [-1, 2, 4, -1])
    """
    if not is_int(q_len) or q_len < 1:
        raise MLAInputError(f"q_len: expected an integer >= 1, got {q_len!r}")
    batch = cache_seqlens.shape[0] if cache_seqlens.dim() == 1 else -1
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=block_table.device) * q_len
    return dcp_step(sharding, rank, block_table, cache_seqlens, cu_seqlens_q, num_tokens=batch * q_len, page_size=page_size)


def _check_step_inputs(
    block_table: torch.Tensor, cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, num_tokens: int, page_size: int
) -> None:
    """Shapes, dtypes and devices (no values: reading them would sync with the device)."""
    if block_table.dim() != 2 or block_table.dtype != torch.int32 or block_table.shape[1] < 1:
        raise MLAInputError(f"block_table: expected int32 [batch, max_pages >= 1], got {block_table.dtype} {tuple(block_table.shape)}")
    batch = block_table.shape[0]
    for name, tensor, shape in (("cache_seqlens", cache_seqlens, (batch,)), ("cu_seqlens_q", cu_seqlens_q, (batch + 1,))):
        if tuple(tensor.shape) != shape or tensor.dtype != torch.int32:
            raise MLAInputError(f"{name}: expected int32 {list(shape)}, got {tensor.dtype} {list(tensor.shape)}")
        if tensor.device != block_table.device:
            raise MLAInputError(f"{name}: expected a tensor on {block_table.device} (the block table's device), got {tensor.device}")
    for name, value, minimum in (("num_tokens", num_tokens, 0), ("page_size", page_size, 1)):
        if not is_int(value) or value < minimum:
            raise MLAInputError(f"{name}: expected an integer >= {minimum}, got {value!r}")


def _check_step_values(
    sharding: TokenSharding, rank: int, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor, num_tokens: int, page_size: int,
) -> None:
    """The values of host (CPU) inputs, which cost no sync to read: offsets that agree with `num_tokens`, and
    lengths whose tokens on this rank fit its table row (otherwise a new token's slot would be an existing
    token's, and the write would overwrite it)."""
    offsets = cu_seqlens_q.tolist()
    if offsets[0] != 0 or offsets[-1] != num_tokens or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise MLAInputError(
            f"cu_seqlens_q: expected non-decreasing offsets from 0 to num_tokens = {num_tokens}, got {offsets}"
        )
    capacity = block_table.shape[1] * page_size
    local = sharding.local_length(cache_seqlens.long(), rank)
    bad = torch.nonzero((cache_seqlens < 0) | (local > capacity))
    if bad.numel():
        i = int(bad[0, 0])
        raise MLAInputError(
            f"cache_seqlens: expected global lengths >= 0 with at most max_pages * page_size = "
            f"{block_table.shape[1]} * {page_size} = {capacity} tokens on this rank (rank {rank} of "
            f"{sharding.dcp_size}); reserve pages for the new tokens first, got cache_seqlens[{i}] = "
            f"{int(cache_seqlens[i])} ({int(local[i])} tokens on rank {rank})"
        )
