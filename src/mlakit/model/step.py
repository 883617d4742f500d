"""What one forward step asks of attention: which sequences, how many new tokens, where they go."""

from __future__ import annotations

import dataclasses
import functools

import torch

from mlakit.errors import MLAInputError


@dataclasses.dataclass(frozen=True)
class AttentionStep:
    """One forward over a batch of sequences, new tokens packed in sequence order.

    Host-side (the scheduler knows these without reading the GPU): `new_tokens[b]`, the
    tokens sequence b adds in this step, and `cache_lens[b]`, its length after they are
    written. Device-side: `block_table` `[batch, max_pages]` int32 and `slots` `[tokens]`
    int64, the flat cache slot of each new token. When every sequence adds the same
    number of tokens and none is a first prefill, the step is a decode (`decode_q_len`).
    """

    new_tokens: tuple[int, ...]
    cache_lens: tuple[int, ...]
    block_table: torch.Tensor
    slots: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.new_tokens) != len(self.cache_lens) or not self.new_tokens:
            raise MLAInputError(
                f"new_tokens and cache_lens: expected equal, non-zero lengths, got {len(self.new_tokens)} and {len(self.cache_lens)}"
            )
        for b, (new, total) in enumerate(zip(self.new_tokens, self.cache_lens)):
            if new < 0 or total < new:
                raise MLAInputError(f"sequence {b}: expected 0 <= new_tokens <= cache_lens, got {new} and {total}")
        if self.slots.shape != (self.num_tokens,):
            raise MLAInputError(f"slots: expected shape [{self.num_tokens}], got {tuple(self.slots.shape)}")

    @property
    def num_tokens(self) -> int:
        return sum(self.new_tokens)

    @property
    def decode_q_len(self) -> int | None:
        """The uniform query length of a decode step, or None for prefill/extend steps."""
        first = self.new_tokens[0]
        uniform = all(n == first for n in self.new_tokens)
        has_prefix = all(total > new for new, total in zip(self.new_tokens, self.cache_lens))
        return first if uniform and has_prefix and first > 0 else None

    @functools.cached_property
    def cache_seqlens(self) -> torch.Tensor:
        """int32 `[batch]` lengths after this step's writes, on the block table's device (made once per step)."""
        return torch.tensor(self.cache_lens, dtype=torch.int32, device=self.block_table.device)

    @functools.cached_property
    def cu_seqlens_q(self) -> torch.Tensor:
        """int32 `[batch + 1]` offsets of each sequence's new tokens in the packed batch (made once per step)."""
        offsets = [0]
        for n in self.new_tokens:
            offsets.append(offsets[-1] + n)
        return torch.tensor(offsets, dtype=torch.int32, device=self.block_table.device)
