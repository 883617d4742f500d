"""Per-step metadata: what one forward asks of attention, and how it splits into kernel calls.

The host supplies only what its scheduler knows as Python ints, per sequence: how many new
tokens it adds (`new_tokens`) and its cache length once they are written (`cache_lens`);
plus, on the device, the block table and the cache slot of every new token. Everything
else (offsets, per-part tables and lengths, the rows of each prefill pass) is derived once
per step, shared by every layer, and never reads device values back to the host.

A step may mix modes. Each sequence goes to one part, and each part runs on its kernel:
- `decode`: it has a cached prefix and adds `decode_q_len` tokens (1, or k + 1 when a
  target model verifies k draft tokens) -> `mla_decode` in the latent form;
- `latent_extend`: a short extend (at most `max_latent_extend_tokens` new tokens, e.g.
  uneven speculative verify or a small chunk) -> `mla_extend` in the latent form;
- `mha_prefill`: longer new segments -> `mla_prefill` in MHA form, prefix in chunks.
Sequences with no new tokens are in no part. Outputs land in the packed token order.

Speculative decoding (EAGLE / MTP) declares its mode, which is checked when the step is made:
`target_verify` (the target model scores k + 1 query tokens per sequence: uniform counts
decode with `decode_q_len = k + 1`, uneven ones extend), `draft_decode` (one draft step:
one new token per sequence; a k-step draft is k steps, each its own metadata, made by
`draft_decode_steps`) and `draft_extend` (the draft model takes in the accepted tokens).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Literal, TypeVar

import torch

from mlakit.attention.functional import DecodeMetadata, ExtendMetadata, mla_decode_metadata, mla_extend_metadata
from mlakit.errors import MLAInputError, is_int
from mlakit.prefill.metadata import (
    DEFAULT_PREFIX_CHUNK_TOKENS,
    PrefillMetadata,
    check_step_counts,
    offsets_of,
    plan_prefill,
    slots_at,
    upload_ints,
)

T = TypeVar("T")
PartKind = Literal["decode", "latent_extend", "mha_prefill"]
PrefillForm = Literal["auto", "latent", "mha"]
SpecMode = Literal["none", "target_verify", "draft_decode", "draft_extend"]
SPEC_MODES = ("none", "target_verify", "draft_decode", "draft_extend")
DEFAULT_MAX_LATENT_EXTEND_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class StepPart:
    """The sequences of a step that run on one kernel, with their own metadata.

    `token_rows` are the part's rows in the packed batch (int64 on the device), or None
    when the part is the whole batch in order. For `decode`, `q_len` is the uniform query
    length; for `mha_prefill`, `prefill` holds the passes. `kv_tokens`: the part's cached tokens in all (from
    the host's lengths), the decode metadata's `kv_tokens_hint`.
    """

    kind: PartKind
    sequences: tuple[int, ...]
    new_tokens: tuple[int, ...]
    token_rows: torch.Tensor | None
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    q_len: int | None = None
    prefill: PrefillMetadata | None = None
    kv_tokens: int | None = None
    _once: dict[tuple, object] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return sum(self.new_tokens)

    def decode_metadata(self, backend: str, heads: int, kv_cache_dtype: str,
                        page_size_hint: int | None = None) -> DecodeMetadata:
        """The decode backend's per-step metadata for this part, built on first use and shared by every layer.
        `page_size_hint`: `mla_decode_metadata`'s `page_size` (`decode_page_size_hint` of the layers' cache)."""
        return self.once(("decode", backend, heads, kv_cache_dtype, page_size_hint), lambda: mla_decode_metadata(
            self.cache_seqlens, q_len=self.q_len or 1, heads=heads, backend=backend, kv_cache_dtype=kv_cache_dtype,
            kv_tokens_hint=self.kv_tokens, page_size=page_size_hint,
        ))

    def extend_metadata(self, backend: str, heads: int, kv_cache_dtype: str,
                        page_size_hint: int | None = None) -> ExtendMetadata:
        """A latent extend's metadata for this part (over its `cu_seqlens_q`), built on first use and shared by every
        layer, as `decode_metadata`; told no cached tokens, so that it plans what a call without metadata plans (the
        variants `warm_up` compiles)."""
        return self.once(("extend", backend, heads, kv_cache_dtype, page_size_hint), lambda: mla_extend_metadata(
            self.cache_seqlens, self.cu_seqlens_q, max_q_len=self.max_q_len, heads=heads, backend=backend,
            kv_cache_dtype=kv_cache_dtype, page_size=page_size_hint,
        ))

    def once(self, key: tuple, build: Callable[[], T]) -> T:
        """`build()`, run on the first call with `key` and its result returned to every later one (a step's layers).

        >>> part = StepPart("decode", (0,), (1,), None, torch.zeros(1, 1), torch.ones(1), torch.tensor([0, 1]), q_len=1)
        >>> part.once(("x",), lambda: [1]) is part.once(("x",), lambda: [2])
        True
        """
        if key not in self._once:
            self._once[key] = build()
        return self._once[key]

    @property
    def max_q_len(self) -> int:
        return max(self.new_tokens)


@dataclasses.dataclass(frozen=True)
class AttentionStep:
    """One forward over a batch of sequences, new tokens packed in sequence order.

    Host ints: `new_tokens[b]`, `cache_lens[b]` (after this step's writes), `page_size`.
    Device: `block_table` `[batch, max_pages]` int32, `slots` `[tokens]` int64 (the flat
    cache slot of each new token). Policy: `decode_q_len` fixes the decode query length
    (None: the uniform new-token count when every sequence has a prefix and adds the same
    number, at most `max_latent_extend_tokens`, else 1); `prefill_form` forces the form of non-decode sequences; `heads` (per rank)
    lets prefix chunking keep each prefill pass's grid full (`plan_prefill`); `spec_mode` says
    which speculative-decoding step this is (checked against the counts).

    >>> table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    >>> step = AttentionStep((1, 40, 3), (9, 40, 12), table, torch.arange(44), page_size=32)
    >>> [(p.kind, p.sequences) for p in step.parts]
    [('decode', (0,)), ('latent_extend', (2,)), ('mha_prefill', (1,))]
    """

    new_tokens: tuple[int, ...]
    cache_lens: tuple[int, ...]
    block_table: torch.Tensor
    slots: torch.Tensor
    page_size: int
    decode_q_len: int | None = None
    prefill_form: PrefillForm = "auto"
    max_latent_extend_tokens: int = DEFAULT_MAX_LATENT_EXTEND_TOKENS
    prefix_chunk_tokens: int = DEFAULT_PREFIX_CHUNK_TOKENS
    heads: int | None = None
    spec_mode: SpecMode = "none"

    def __post_init__(self) -> None:
        check_step_counts(self.new_tokens, self.cache_lens, self.block_table, self.page_size)
        if not isinstance(self.slots, torch.Tensor) or self.slots.shape != (self.num_tokens,) or (
            self.num_tokens and self.slots.dtype != torch.int64  # an empty step may spell its slots torch.tensor([])
        ):
            got = f"{self.slots.dtype} of shape {tuple(self.slots.shape)}" if isinstance(self.slots, torch.Tensor) else type(self.slots).__name__
            raise MLAInputError(f"slots: expected shape [{self.num_tokens}] and dtype int64, got {got}")
        for name, minimum, optional in (("decode_q_len", 1, True), ("max_latent_extend_tokens", 0, False),
                                        ("prefix_chunk_tokens", 1, False), ("heads", 1, True)):
            value = getattr(self, name)
            if not (optional and value is None) and (not is_int(value) or value < minimum):
                raise MLAInputError(f"{name}: expected {'None or ' if optional else ''}an integer >= {minimum}, got {value!r}")
        if self.prefill_form not in ("auto", "latent", "mha"):
            raise MLAInputError(f"prefill_form: expected 'auto', 'latent' or 'mha', got {self.prefill_form!r}")
        self._check_spec_mode()

    def _check_spec_mode(self) -> None:
        if self.spec_mode not in SPEC_MODES:
            raise MLAInputError(f"spec_mode: expected one of {SPEC_MODES}, got {self.spec_mode!r}")
        if self.spec_mode == "none":
            return
        for b, (new, total) in enumerate(zip(self.new_tokens, self.cache_lens)):
            if new and total == new:
                raise MLAInputError(f"sequence {b}: a {self.spec_mode} step needs a cached prefix, got {new} new of {total} tokens")
            if self.spec_mode == "draft_decode" and new > 1:
                raise MLAInputError(f"sequence {b}: a draft_decode step adds at most 1 token per sequence, got {new}")
            if self.spec_mode == "target_verify" and self.decode_q_len is not None and new > self.decode_q_len:
                raise MLAInputError(
                    f"sequence {b}: target_verify with decode_q_len {self.decode_q_len} (k + 1) got {new} query tokens"
                )

    @property
    def num_tokens(self) -> int:
        return sum(self.new_tokens)

    @property
    def batch_decode_q_len(self) -> int:
        """The query length that makes a sequence a decode sequence in this step."""
        if self.decode_q_len is not None:
            return self.decode_q_len
        first = self.new_tokens[0]
        uniform = all(n == first for n in self.new_tokens)
        has_prefix = all(total > new for new, total in zip(self.new_tokens, self.cache_lens))
        short = first <= self.max_latent_extend_tokens  # equal long chunks are a chunked prefill, not a decode
        return first if uniform and has_prefix and short and first > 0 else 1

    @functools.cached_property
    def cache_seqlens(self) -> torch.Tensor:
        """int32 `[batch]` lengths after this step's writes, on the block table's device."""
        return upload_ints(list(self.cache_lens), self.block_table.device, torch.int32)

    @functools.cached_property
    def parts(self) -> tuple[StepPart, ...]:
        """The step's sequences grouped by kernel (decode, latent extend, MHA prefill), built once."""
        by_kind: dict[PartKind, list[int]] = {"decode": [], "latent_extend": [], "mha_prefill": []}
        for b, (new, total) in enumerate(zip(self.new_tokens, self.cache_lens)):
            if new:
                by_kind[self._kind_of(new, total)].append(b)
        offsets = offsets_of(self.new_tokens)
        whole = len(self.new_tokens)
        return tuple(
            self._part(kind, sequences, offsets, whole_batch=len(sequences) == whole)
            for kind, sequences in by_kind.items()
            if sequences
        )

    def _kind_of(self, new: int, total: int) -> PartKind:
        if total > new and new == self.batch_decode_q_len:
            return "decode"
        if self.prefill_form == "latent" or (self.prefill_form == "auto" and new <= self.max_latent_extend_tokens):
            return "latent_extend"
        return "mha_prefill"

    def _part(self, kind: PartKind, sequences: list[int], offsets: list[int], whole_batch: bool) -> StepPart:
        device = self.block_table.device
        new = tuple(self.new_tokens[b] for b in sequences)
        lens = [self.cache_lens[b] for b in sequences]
        if whole_batch:
            rows, table, seqlens = None, self.block_table, self.cache_seqlens
        else:
            rows = upload_ints([r for b in sequences for r in range(offsets[b], offsets[b + 1])], device, torch.int64)
            table = self.block_table[upload_ints(sequences, device, torch.int64)]
            seqlens = upload_ints(lens, device, torch.int32)
        cu = offsets_of(new)
        prefill = None
        if kind == "mha_prefill":
            prefill = plan_prefill(
                new, lens, table, self.page_size, prefix_chunk_tokens=self.prefix_chunk_tokens, heads=self.heads
            )
        return StepPart(
            kind=kind,
            sequences=tuple(sequences),
            new_tokens=new,
            token_rows=rows,
            block_table=table,
            cache_seqlens=seqlens,
            cu_seqlens_q=upload_ints(cu, device, torch.int32),
            q_len=self.batch_decode_q_len if kind == "decode" else None,
            prefill=prefill,
            kv_tokens=sum(lens),
        )


def draft_decode_steps(
    cache_lens: tuple[int, ...], block_table: torch.Tensor, page_size: int, num_steps: int, *, heads: int | None = None
) -> tuple[AttentionStep, ...]:
    """The metadata of a k-step draft: step i adds one token per sequence at position
    `cache_lens[b] + i` (its slot read from the block table on the device); one state per step,
    as multi-step drafting needs (each step sees one more token). Sequences of length 0 idle.

    >>> table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    >>> steps = draft_decode_steps((3, 4), table, page_size=4, num_steps=2)
    >>> [s.cache_lens for s in steps], steps[1].slots.tolist()
    ([(4, 5), (5, 6)], [0, 13])
    """
    if not is_int(num_steps) or num_steps < 1:
        raise MLAInputError(f"num_steps: expected an integer >= 1, got {num_steps!r}")
    if not isinstance(cache_lens, tuple | list) or not all(is_int(n) and n >= 0 for n in cache_lens):
        raise MLAInputError(f"cache_lens: expected a tuple of integers >= 0 (host ints), got {cache_lens!r}")
    active = [1 if n > 0 else 0 for n in cache_lens]
    check_step_counts(active, [n + num_steps * a for n, a in zip(cache_lens, active)], block_table, page_size)
    live = [b for b, a in enumerate(active) if a]
    sequences = upload_ints(live, block_table.device, torch.int64)
    base = upload_ints([cache_lens[b] for b in live], block_table.device, torch.int64)
    steps = []
    for i in range(num_steps):
        slots = slots_at(block_table, sequences, base + i, page_size)
        steps.append(AttentionStep(
            tuple(active), tuple(n + (i + 1) * a for n, a in zip(cache_lens, active)), block_table, slots,
            page_size=page_size, heads=heads, spec_mode="draft_decode",
        ))
    return tuple(steps)
