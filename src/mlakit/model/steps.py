"""A step's cache reservations and metadata, on one process or one rank of a multi-GPU model.

Without decode context parallelism every rank's cache holds every token, and a step is an
`AttentionStep`. With it (`ParallelGroups.dcp_size > 1`), each rank reserves pages only for the
tokens it owns (`TokenSharding.local_length`), and a step is this rank's `DCPStep`; the host
tracks the sequences' GLOBAL lengths, as the metadata wants them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mlakit.cache import PagedLatentCache
from mlakit.distributed.groups import ParallelGroups
from mlakit.distributed.step import DCPStep, dcp_step
from mlakit.prefill.metadata import offsets_of, upload_ints
from mlakit.serving.step import DEFAULT_MAX_LATENT_EXTEND_TOKENS, AttentionStep


def shards_cache(parallel: ParallelGroups | None) -> bool:
    """Whether each rank caches only its share of the tokens (decode context parallelism).

    >>> shards_cache(None)
    False
    """
    return parallel is not None and parallel.dcp_size > 1


def cached_tokens(length: int, parallel: ParallelGroups | None) -> int:
    """How many of a sequence's first `length` tokens the fullest rank caches: all of them, or
    DCP rank 0's share (tokens are dealt from rank 0, so it never holds fewer than another).
    Sizing admission by it keeps every rank's scheduling decisions the same.

    >>> cached_tokens(10, None)
    10
    """
    return parallel.sharding.local_length(length, 0) if shards_cache(parallel) else length


def reserve_step(
    cache: PagedLatentCache,
    parallel: ParallelGroups | None,
    sequences: Sequence[int],
    starts: Sequence[int],
    new_tokens: Sequence[int],
    *,
    heads: int | None = None,
    max_latent_extend_tokens: int = DEFAULT_MAX_LATENT_EXTEND_TOKENS,
) -> AttentionStep | DCPStep:
    """Reserves cache room for `new_tokens[i]` tokens of sequence `sequences[i]` at global
    positions `starts[i] ..` and returns the step's metadata: an `AttentionStep` (`heads` and
    `max_latent_extend_tokens` as there), or under DCP this rank's `DCPStep` (only the tokens it
    owns reserved; every token runs in the latent form).

    >>> cache = PagedLatentCache(num_pages=4, page_size=4, kv_lora_rank=8, rope_dim=8)
    >>> step = reserve_step(cache, None, [0, 1], [0, 0], [3, 5])
    >>> step.cache_lens, step.slots.tolist()
    ((3, 5), [0, 1, 2, 4, 5, 6, 7, 8])
    """
    if not shards_cache(parallel):
        slots = torch.cat([cache.reserve(seq, n) for seq, n in zip(sequences, new_tokens)])
        return AttentionStep(
            tuple(new_tokens), tuple(cache.seq_len(seq) for seq in sequences), cache.block_table(list(sequences)), slots,
            page_size=cache.page_size, heads=heads, max_latent_extend_tokens=max_latent_extend_tokens,
        )
    sharding, rank = parallel.sharding, parallel.dcp_rank
    ends = [start + n for start, n in zip(starts, new_tokens)]
    for seq, start, end in zip(sequences, starts, ends):
        cache.reserve(seq, sharding.local_length(end, rank) - sharding.local_length(start, rank))
    device = cache.device
    return dcp_step(
        sharding, rank, cache.block_table(list(sequences)), upload_ints(ends, device, torch.int32),
        upload_ints(offsets_of(list(new_tokens)), device, torch.int32), num_tokens=sum(new_tokens), page_size=cache.page_size,
    )
