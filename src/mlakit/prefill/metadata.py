"""Per-step metadata of an MHA-form prefill: which cache rows are the keys of each attention pass.

The host supplies only what its scheduler already knows, as Python ints: each sequence's
new-token count and its cache length after this step's writes. Everything that depends on
device data (the cache slot of every key row, read through the block table) is computed on
the GPU, so building the metadata never waits for the device.

A prefill runs one causal pass over each sequence's new tokens and, when the cached
prefixes are longer in total than `prefix_chunk_tokens`, non-causal passes over prefix
chunks of at most that many rows (all sequences' prefixes laid end to end and cut; shared
by as many sequences as keep the GPU's last wave of programs full), merged
into the running result by lse. When the prefixes fit in one chunk, they join the causal pass instead: one pass, no
merge. Either way the rows decompressed at once stay bounded by the chunk size plus the new
tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence

import torch

from mlakit.device import sm_count
from mlakit.errors import MLAInputError, is_int

DEFAULT_PREFIX_CHUNK_TOKENS = 8192
PREFILL_BLOCK_ROWS = 128  # query rows per program of the prefill kernel on GPUs
DEFAULT_SMS = 132  # for plans made off a GPU (an H100's count)
WAVE_FILL = 0.9  # `_chunk_sharing`: how full a pass's last wave of programs should be


@dataclasses.dataclass(frozen=True)
class Segments:
    """Ragged segments, one per sequence: host lengths and their int32 offsets `[batch + 1]` on the device."""

    lens: tuple[int, ...]
    cu_seqlens: torch.Tensor

    def __post_init__(self) -> None:
        if self.cu_seqlens.shape != (len(self.lens) + 1,) or self.cu_seqlens.dtype != torch.int32:
            raise MLAInputError(
                f"cu_seqlens: expected int32 offsets of shape [{len(self.lens) + 1}], got {self.cu_seqlens.dtype} "
                f"{tuple(self.cu_seqlens.shape)}"
            )
        if min(self.lens, default=0) < 0:
            raise MLAInputError(f"lens: expected lengths >= 0, got {self.lens}")

    @property
    def total(self) -> int:
        return sum(self.lens)

    @property
    def max_len(self) -> int:
        return max(self.lens, default=0)


@dataclasses.dataclass(frozen=True)
class KeyRows:
    """The cache rows of one attention pass: for sequence b, its tokens `starts[b] .. starts[b] + lens[b] - 1`,
    found at the flat cache slots `slots` (int64, `[total rows]`, in segment order)."""

    segments: Segments
    starts: tuple[int, ...]
    slots: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.segments.lens) or self.slots.shape != (self.segments.total,):
            raise MLAInputError(
                f"KeyRows: expected one start per segment and {self.segments.total} slots, got {len(self.starts)} "
                f"starts and slots of shape {tuple(self.slots.shape)}"
            )


@dataclasses.dataclass(frozen=True)
class PrefillMetadata:
    """What an MHA-form prefill of one step reads: query segments, the causal pass, the prefix chunks.

    Build it once per step with `plan_prefill` and pass it to every layer's `mla_prefill`.
    """

    queries: Segments
    causal_keys: KeyRows
    prefix_chunks: tuple[KeyRows, ...]
    page_size: int
    # Calls prepared by the backend per input layout (`mla_prefill` with check_inputs=False), as DecodeMetadata.calls.
    calls: dict[tuple, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = dataclasses.field(
        default_factory=dict, init=False, compare=False, repr=False)

    @functools.cached_property
    def merges_per_row(self) -> int:
        """The most prefix chunks one sequence's query rows are merged with (0 when one pass serves the step).

        >>> table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
        >>> plan_prefill([2, 3], [6, 3], table, page_size=4, prefix_chunk_tokens=2).merges_per_row
        2
        """
        return max((sum(1 for chunk in self.prefix_chunks if chunk.segments.lens[b]) for b in range(len(self.queries.lens))),
                   default=0)

    @property
    def passes(self) -> tuple[tuple[KeyRows, bool], ...]:
        """Each attention pass's key rows and whether it is causal: the new tokens' pass, then the prefix chunks."""
        return ((self.causal_keys, True), *((chunk, False) for chunk in self.prefix_chunks))


def plan_prefill(
    new_tokens: Sequence[int],
    cache_lens: Sequence[int],
    block_table: torch.Tensor,
    page_size: int,
    *,
    prefix_chunk_tokens: int = DEFAULT_PREFIX_CHUNK_TOKENS,
    heads: int | None = None,
) -> PrefillMetadata:
    """Metadata for a prefill of `new_tokens[b]` new tokens per sequence, whose cache holds
    `cache_lens[b]` tokens after the new ones were written (so the prefix is the difference).
    `heads` (per rank), when given, lets the chunk cut keep every pass's grid full.

    >>> table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    >>> meta = plan_prefill([2, 3], [6, 3], table, page_size=4, prefix_chunk_tokens=2)
    >>> meta.causal_keys.segments.lens, [c.segments.lens for c in meta.prefix_chunks]
    ((2, 3), [(2, 0), (2, 0)])
    >>> [c.segments.lens for c in plan_prefill([1, 1], [9, 4], table, 8, prefix_chunk_tokens=6).prefix_chunks]
    [(6, 0), (2, 3)]
    >>> [c.segments.lens for c in plan_prefill([1, 1], [9, 4], table, 8, prefix_chunk_tokens=6, heads=1).prefix_chunks]
    [(3, 3), (5, 0)]
    >>> meta.causal_keys.slots.tolist()
    [0, 1, 4, 5, 6]
    """
    check_step_counts(new_tokens, cache_lens, block_table, page_size)
    new_tokens, cache_lens = tuple(int(n) for n in new_tokens), tuple(int(c) for c in cache_lens)
    if not is_int(prefix_chunk_tokens) or prefix_chunk_tokens < 1:
        raise MLAInputError(f"prefix_chunk_tokens: expected an integer >= 1, got {prefix_chunk_tokens!r}")
    if heads is not None and (not is_int(heads) or heads < 1):
        raise MLAInputError(f"heads: expected >= 1 (an integer, or None), got {heads!r}")
    device = block_table.device
    prefixes = [total - new if new else 0 for new, total in zip(new_tokens, cache_lens)]  # no queries: nothing to read
    queries = _segments(new_tokens, device)
    if sum(prefixes) <= prefix_chunk_tokens:
        whole = [total if new else 0 for new, total in zip(new_tokens, cache_lens)]
        causal = _key_rows(block_table, page_size, [0] * len(prefixes), whole, device)
        return PrefillMetadata(queries, causal, (), page_size)
    causal = _key_rows(block_table, page_size, prefixes, list(new_tokens), device)
    sharing = _chunk_sharing(new_tokens, prefixes, heads, device)
    chunks = tuple(
        _key_rows(block_table, page_size, starts, lens, device) for starts, lens in _cut_prefixes(prefixes, prefix_chunk_tokens, sharing)
    )
    return PrefillMetadata(queries, causal, chunks, page_size)


def check_step_counts(new_tokens: Sequence[int], cache_lens: Sequence[int], block_table: torch.Tensor, page_size: int) -> None:
    """Raises MLAInputError unless there is one count per sequence, 0 <= new <= cache length, and
    every cache length fits the block table's pages (host ints only, no device read)."""
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.dtype != torch.int32:
        got = f"{block_table.dtype} of shape {tuple(block_table.shape)}" if isinstance(block_table, torch.Tensor) else type(block_table).__name__
        raise MLAInputError(f"block_table: expected an int32 tensor [batch, max_pages], got {got}")
    for name, counts in (("new_tokens", new_tokens), ("cache_lens", cache_lens)):
        if not isinstance(counts, Sequence) or isinstance(counts, str):
            raise MLAInputError(f"{name}: expected a sequence of ints (one per sequence), got {type(counts).__name__}")
        bad = next((b for b, value in enumerate(counts) if not is_int(value)), None)
        if bad is not None:
            raise MLAInputError(f"{name}[{bad}]: expected an integer, got {counts[bad]!r}")
    if len(new_tokens) != len(cache_lens) or not new_tokens or block_table.dim() != 2 or len(new_tokens) != block_table.shape[0]:
        raise MLAInputError(
            f"new_tokens, cache_lens and block_table: expected one entry (row) per sequence, at least one, got "
            f"{len(new_tokens)}, {len(cache_lens)} and a table of shape {tuple(block_table.shape)}"
        )
    if not is_int(page_size) or page_size < 1:
        raise MLAInputError(f"page_size: expected an integer >= 1, got {page_size!r}")
    capacity = block_table.shape[1] * page_size
    for b, (new, total) in enumerate(zip(new_tokens, cache_lens)):
        if new < 0 or total < new:
            raise MLAInputError(f"sequence {b}: expected 0 <= new_tokens <= cache_lens, got {new} and {total}")
        if total > capacity:
            raise MLAInputError(f"cache_lens[{b}]: {total} tokens do not fit the block table's {block_table.shape[1]} pages of {page_size}")


def _cut_prefixes(prefixes: list[int], chunk: int, sharing: int) -> list[tuple[list[int], list[int]]]:
    """Per chunk, each sequence's (start, length) within its prefix: the prefixes end to end, cut
    every `chunk` rows, one sequence giving a chunk at most `chunk / sharing` rows while that many
    are unfinished (the next one then takes its turn; the rest follows in the next chunk), unless
    the others cannot fill it."""
    chunks: list[tuple[list[int], list[int]]] = []
    taken = [0] * len(prefixes)
    while unfinished := sum(t < p for t, p in zip(taken, prefixes)):
        room = chunk
        span = max(1, chunk // min(sharing, unfinished))
        starts, lens = list(taken), [0] * len(prefixes)
        for cap in (span, chunk):  # the second sweep fills what short prefixes left of the chunk
            for b, prefix in enumerate(prefixes):
                length = min(prefix - taken[b], room, cap - lens[b])
                lens[b] += length
                taken[b] += length
                room -= length
        chunks.append((starts, lens))
    return chunks


def _chunk_sharing(new_tokens: tuple[int, ...], prefixes: list[int], heads: int | None, device: torch.device) -> int:
    """How many sequences share a chunk. A sequence's queries merge once per chunk they meet, so
    one sequence per chunk is cheapest; but a pass's programs (query row blocks x heads of its
    sequences, all about as long) run in waves of one per SM, and a part-filled last wave costs a
    whole one: so the fewest sequences whose pass fills its last wave to `WAVE_FILL`, else the
    fewest that fill it best."""
    queries = [n for n, p in zip(new_tokens, prefixes) if p]
    if heads is None or not queries:
        return 1
    sms = sm_count(device, off_gpu=DEFAULT_SMS)
    units_per_sequence = heads * math.ceil(sum(queries) / len(queries) / PREFILL_BLOCK_ROWS)
    choices = range(1, len(queries) + 1)
    fills = {shared: _wave_fill(shared * units_per_sequence, sms) for shared in choices}
    return next((shared for shared in choices if fills[shared] >= WAVE_FILL), max(choices, key=fills.__getitem__))


def _wave_fill(units: int, sms: int) -> float:
    """The share of `sms` x waves busy when `units` (>= 1) programs of equal length run in waves of `sms`.

    >>> _wave_fill(64, 132), _wave_fill(128, 132), _wave_fill(192, 132)
    (0.48484848484848486, 0.9696969696969697, 0.7272727272727273)
    """
    return units / (math.ceil(units / sms) * sms)


def _segments(lens: Sequence[int], device: torch.device) -> Segments:
    return Segments(tuple(lens), upload_ints(offsets_of(lens), device, torch.int32))


def offsets_of(lens: Sequence[int]) -> list[int]:
    """`[0, lens[0], lens[0] + lens[1], ...]`: segment offsets.

    >>> offsets_of([3, 0, 2])
    [0, 3, 3, 5]
    """
    return [0, *itertools.accumulate(lens)]


def _key_rows(block_table: torch.Tensor, page_size: int, starts: list[int], lens: list[int], device: torch.device) -> KeyRows:
    """Slots of the rows `starts[b] .. starts[b] + lens[b] - 1` of every sequence, computed on the device."""
    segments = _segments(lens, device)
    batch, rows = len(lens), sum(lens)
    seq_starts = upload_ints(starts, device, torch.int64)
    lengths = segments.cu_seqlens[1:] - segments.cu_seqlens[:-1]
    seq = torch.repeat_interleave(torch.arange(batch, device=device), lengths, output_size=rows)
    positions = torch.arange(rows, device=device) - segments.cu_seqlens[seq] + seq_starts[seq]
    return KeyRows(segments, tuple(starts), slots_at(block_table, seq, positions, page_size))


def slots_at(block_table: torch.Tensor, sequences: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
    """int64 flat cache slots of token `positions[i]` of sequence `sequences[i]`, read through the
    block table on its device (positions must lie within the table's pages).

    >>> slots_at(torch.tensor([[2, 0], [1, 3]]), torch.tensor([0, 1]), torch.tensor([5, 6]), page_size=4)
    tensor([ 1, 14])
    """
    return block_table[sequences, positions // page_size].long() * page_size + positions % page_size


def upload_ints(values: Sequence[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A small host list of ints on `device`, copied without waiting for the device (pinned staging on CUDA)."""
    return upload(torch.tensor(values, dtype=dtype), device)


def upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`: as it is where it is there already, else copied from the host without waiting for the
    device (pinned staging on CUDA).

    >>> upload(torch.arange(3), torch.device("cpu")).tolist()
    [0, 1, 2]
    """
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
