"""CUDA graphs of a decode step, one per batch-size bucket, over persistent input buffers.

A graph holds raw pointers, so everything a decode step reads lives in buffers reserved
once for the largest bucket: queries, block table, lengths, cache slots of the new tokens.
`fill` writes a step's real rows into them and pads the rest; it is the only way metadata
reaches the buffers, for the capture and for every replay alike. Padded rows get length 0
(the kernels give them zeros and lse = -inf without reading a page), block-table entries
of page 0 (a valid index, never read), slot -1 (the cache write skips it) and zero
queries; their outputs are zeroed in the graph as well, so they are defined whatever a
backend does with an empty sequence. The captured kernels check nothing, so `DecodeGraphs.run`
checks a step's values first (`check_step_values`, one host sync) unless told not to.

Whatever the step computes from the buffers (one layer, a whole attention stack, the
split plan included) is captured; nothing in it may sync with the host or grow a
workspace (`WorkspacePool` refuses growth during capture, naming the fix).

`capture_graph` is the capture sequence itself, shared by `DecodeGraphs`, the benchmarks and the
tests: warm-ups on a side stream ordered against the current stream, then one captured call
whose outputs are the graph's static outputs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from mlakit.attention.checks import check_lengths_and_pages
from mlakit.cache.paged import slot_failure, slots_outside
from mlakit.errors import ConfigError, MLAInputError, is_int
from mlakit.registry.catalog import all_records, get_backend

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

T = TypeVar("T")


def capture_graph(
    fn: Callable[[], T],
    *,
    warmup: int = 1,
    pool: tuple[int, int] | None = None,
    stream: torch.cuda.Stream | None = None,
    forbid_host_sync: bool = False,
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Runs `fn()` `warmup` times on a side stream, then captures one more call in a CUDA graph.

    The side stream waits for the current stream before the warm-ups and the current stream waits
    for the side stream after them, so the warm-ups see every earlier write and later work sees
    theirs. The warm-ups compile kernels and fill caches outside the capture (one is enough for
    mlakit's calls; run `fn` eagerly beforehand as well where something, such as an NCCL
    communicator, must start on the current stream). Returns the graph and what the captured call
    returned: tensors in it are the graph's static outputs, rewritten by every `graph.replay()`,
    which reads whatever the tensors `fn` read hold at that time.

    `pool` (`torch.cuda.graph_pool_handle()`) and `stream` (warm-ups and capture run on it; a new
    stream by default) let several captures share one memory pool, as `DecodeGraphs.capture`
    does. `forbid_host_sync=True` captures under `torch.cuda.set_sync_debug_mode("error")`, so a
    host sync inside `fn` raises where it happens (the warm-ups may still sync).

    Example, on a CUDA device::

        x = torch.zeros(4, device="cuda")
        graph, y = capture_graph(lambda: x * 2 + 1)
        x.copy_(torch.arange(4.0))
        graph.replay()             # y is now [1., 3., 5., 7.]
    """
    if not callable(fn):
        raise ConfigError(f"fn: expected a callable taking no arguments, got {type(fn).__name__} {fn!r}")
    if not is_int(warmup) or warmup < 0:
        raise ConfigError(f"warmup: expected an int >= 0 (eager calls before the capture), got {warmup!r}")
    if stream is not None and not isinstance(stream, torch.cuda.Stream):
        raise ConfigError(f"stream: expected a torch.cuda.Stream or None, got {type(stream).__name__} {stream!r}")
    if not torch.cuda.is_available():
        raise ConfigError("capture_graph: CUDA graphs need a CUDA device (torch sees none); call fn eagerly instead")
    side = torch.cuda.Stream() if stream is None else stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    sync_mode = torch.cuda.get_sync_debug_mode()
    if forbid_host_sync:
        torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph, pool=pool, stream=side):
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode(sync_mode)
    return graph, out


@dataclasses.dataclass(frozen=True)
class DecodeBuffers:
    """Persistent inputs of a captured decode step, sized for the largest bucket.

    `q [rows, q_len, heads, dim]`, `block_table [rows, max_pages]` int32, `cache_seqlens [rows]`
    int32, `slots [rows * q_len]` int64 and `real_rows [rows]` bool (False on padding). A
    bucket's step reads the first `bucket` rows (`view`).
    """

    q: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    slots: torch.Tensor
    real_rows: torch.Tensor

    @classmethod
    def allocate(
        cls, max_batch: int, q_len: int, heads: int, dim: int, max_pages: int, dtype: torch.dtype, device: torch.device
    ) -> DecodeBuffers:
        return cls(
            q=torch.zeros(max_batch, q_len, heads, dim, dtype=dtype, device=device),
            block_table=torch.zeros(max_batch, max_pages, dtype=torch.int32, device=device),
            cache_seqlens=torch.zeros(max_batch, dtype=torch.int32, device=device),
            slots=torch.full((max_batch * q_len,), -1, dtype=torch.int64, device=device),
            real_rows=torch.zeros(max_batch, dtype=torch.bool, device=device),
        )

    def view(self, rows: int) -> DecodeBuffers:
        """The first `rows` rows of every buffer (views: capture and replay see the same memory)."""
        q_len = self.q.shape[1]
        return DecodeBuffers(self.q[:rows], self.block_table[:rows], self.cache_seqlens[:rows],
                             self.slots[: rows * q_len], self.real_rows[:rows])

    def fill(self, q: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor, slots: torch.Tensor | None, rows: int) -> None:
        """Writes one step's real rows and pads rows `batch .. rows - 1` (device copies, no host sync)."""
        batch, pages = q.shape[0], block_table.shape[1]
        self.q[:batch].copy_(q)
        self.q[batch:rows].zero_()
        self.block_table[:batch, :pages].copy_(block_table)
        self.block_table[:batch, pages:].zero_()
        self.block_table[batch:rows].zero_()
        self.cache_seqlens[:batch].copy_(cache_seqlens)
        self.cache_seqlens[batch:rows].zero_()
        tokens = batch * self.q.shape[1]
        if slots is None:
            self.slots[:tokens].fill_(-1)
        else:
            self.slots[:tokens].copy_(slots)
        self.slots[tokens : rows * self.q.shape[1]].fill_(-1)
        self.real_rows[:batch].fill_(True)
        self.real_rows[batch:rows].fill_(False)


DecodeStep = Callable[[DecodeBuffers], torch.Tensor]


def check_step_values(
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    slots: torch.Tensor | None,
    *,
    page_size: int,
    num_pages: int,
) -> None:
    """Raises MLAInputError naming the first bad value of a decode step over a cache of `num_pages`
    pages of `page_size` tokens: a length < 0 or beyond the table's pages (`block_table.shape[1] *
    page_size`), a page index outside [0, num_pages) in a column the length uses
    (`check_lengths_and_pages`), a slot neither -1 (padding) nor in [0, num_pages * page_size).
    Reads the values in one host sync; shapes, dtypes and one device for all three are the
    caller's to check (`DecodeGraphs.run` does).

    >>> table = torch.tensor([[2, 0], [1, -1]], dtype=torch.int32)  # -1: a column length 9 does not use
    >>> lengths = torch.tensor([20, 9], dtype=torch.int32)
    >>> check_step_values(table, lengths, torch.tensor([3, 24]), page_size=16, num_pages=4)
    >>> check_step_values(table, lengths, torch.tensor([3, 64]), page_size=16, num_pages=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: slots: expected -1 (padding) or a flat slot in [0, 64) (...), got slots[1] = 64
    """
    num_slots = num_pages * page_size
    slot_bad = None
    if slots is not None and slots.numel():
        outside = slots_outside(slots, num_slots)
        # Copied without waiting: check_lengths_and_pages' read syncs the same stream, after which it has landed.
        slot_bad = outside.any().to("cpu", non_blocking=True)
    check_lengths_and_pages(block_table, cache_seqlens, page_size, num_pages)
    if slot_bad is not None and bool(slot_bad):
        raise slot_failure(slots, outside, num_slots, f" (num_pages * page_size = {num_pages} * {page_size})")


def require_capturable(backend: str) -> None:
    """Raises ConfigError, listing the backends that can, when `backend`'s record says no CUDA graphs.

    >>> require_capturable("triton")
    """
    if not get_backend(backend).record.cuda_graphs:
        capturable = [r.name for r in all_records() if r.cuda_graphs]
        raise ConfigError(
            f"backend {backend!r} cannot be captured in a CUDA graph (its record says so); run its decode eagerly "
            f"(cuda_graphs=False) or pick a backend that can: {', '.join(capturable)}"
        )


class DecodeGraphs:
    """One CUDA graph of `step` per batch bucket; `run` replays the smallest bucket that fits.

    `step(buffers)` returns a tensor whose first dim is the bucket's rows (e.g. the attention
    output `[rows, q_len, heads, kv_lora_rank]`, or a stack of layers' outputs with the rows
    first). `backend` is the decode backend the step runs on: one whose record says it cannot
    be captured is refused here. `page_size` and `num_pages` describe the cache the step reads
    (what `run` checks page indices, lengths and slots against). `capture()` runs each bucket
    once eagerly (compiling every kernel variant it launches) and then captures it, largest
    first, in one memory pool.

    A CUDA device is needed; the README's "CUDA graphs" section has a complete example, and
    tests/test_graphs.py captures and replays real steps.
    """

    def __init__(
        self,
        step: DecodeStep,
        *,
        backend: str,
        max_batch: int,
        q_len: int,
        heads: int,
        dim: int,
        max_pages: int,
        page_size: int,
        num_pages: int,
        dtype: torch.dtype,
        device: torch.device | str,
        buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    ) -> None:
        require_capturable(backend)
        if not (is_int(page_size) and is_int(num_pages) and page_size >= 1 and num_pages >= 1):
            raise ConfigError(
                "page_size and num_pages: expected ints >= 1 (the cache the step reads: num_pages pages of page_size "
                f"tokens), got {page_size!r} and {num_pages!r}"
            )
        if not isinstance(device, torch.device):
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as exc:
                raise ConfigError(f"device: expected a torch.device or a device string such as 'cuda:0', got {device!r}") from exc
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ConfigError(f"device: CUDA graphs need a CUDA device, got {device}{'' if device.type != 'cuda' else ' (torch sees none)'}")
        if not all(is_int(v) for v in (max_batch, q_len, *buckets)) or max_batch < 1 or q_len < 1 or min(buckets, default=1) < 1:
            raise ConfigError(f"max_batch, q_len and buckets: expected >= 1, got {max_batch}, {q_len} and {tuple(buckets)}")
        self.page_size, self.num_pages = page_size, num_pages
        chosen = sorted({b for b in buckets if b <= max_batch} | {max_batch})
        self.buckets = tuple(chosen)
        self.step = step
        self.buffers = DecodeBuffers.allocate(max_batch, q_len, heads, dim, max_pages, dtype, device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @property
    def max_batch(self) -> int:
        return self.buffers.q.shape[0]

    def bucket_for(self, batch: int) -> int:
        """The smallest captured bucket holding `batch` rows."""
        for bucket in self.buckets:
            if bucket >= batch:
                return bucket
        raise MLAInputError(f"batch: expected at most {self.max_batch} sequences (the largest graph bucket), got {batch}")

    def capture(self, warm_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
        """Captures every bucket. The buffers hold `warm_inputs` (q, block_table, cache_seqlens) or,
        by default, all-padding rows while each bucket runs once eagerly and is captured."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for bucket in reversed(self.buckets):
            self._fill_for(bucket, warm_inputs)
            step = functools.partial(self._masked_step, self.buffers.view(bucket))
            self._graphs[bucket] = capture_graph(step, warmup=1, pool=pool, stream=stream)

    def run(
        self,
        q: torch.Tensor,
        block_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        slots: torch.Tensor | None = None,
        *,
        check_values: bool = True,
    ) -> torch.Tensor:
        """Fills the buffers with this step's rows and replays the bucket's graph; returns the real
        rows of its output (a view into graph memory, valid until the next replay).

        Shapes, dtypes and devices are always checked. `check_values=True` also checks the values
        (`check_step_values`: page indices, lengths against `block_table`'s columns, slots), at one
        host sync per step; the captured kernels would read a wrong page or write outside the cache
        instead. `check_values=False` skips that (no sync) for a scheduler that guarantees its tables,
        and for steps whose lengths are not the table's, such as a DCP step's global lengths over a
        rank's local table.
        """
        named = {"q": q, "block_table": block_table, "cache_seqlens": cache_seqlens, "slots": slots}
        for name, value in named.items():
            if not isinstance(value, torch.Tensor) and not (name == "slots" and value is None):
                raise MLAInputError(f"{name}: expected a tensor{' or None' if name == 'slots' else ''}, "
                                    f"got {type(value).__name__}")
        if q.dim() < 1 or block_table.dim() < 1:
            bad = "q" if q.dim() < 1 else "block_table"
            raise MLAInputError(f"{bad}: expected a tensor with a batch axis, got shape {tuple(named[bad].shape)}")
        batch = q.shape[0]
        bucket = self.bucket_for(batch)
        self._check_step(q, block_table, cache_seqlens, slots)
        if check_values:
            check_step_values(block_table, cache_seqlens, slots, page_size=self.page_size, num_pages=self.num_pages)
        self.buffers.fill(q, block_table, cache_seqlens, slots, bucket)
        return self.replay(batch)[:batch]

    def replay(self, batch: int) -> torch.Tensor:
        """Replays the graph of `batch`'s bucket on the buffers as they are (no fill); returns the
        whole bucket's output, padded rows included (zeros)."""
        bucket = self.bucket_for(batch)
        if bucket not in self._graphs:
            raise MLAInputError("DecodeGraphs.replay: capture() first")
        graph, out = self._graphs[bucket]
        graph.replay()
        return out

    def _check_step(self, q: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor, slots: torch.Tensor | None) -> None:
        """Shapes, dtypes and devices against the buffers (a copy would broadcast or cast silently)."""
        batch, buffers = q.shape[0], self.buffers
        expected = (
            ("q", q, (batch, *buffers.q.shape[1:]), buffers.q.dtype),
            ("block_table", block_table, (batch, min(block_table.shape[-1], buffers.block_table.shape[1])), torch.int32),
            ("cache_seqlens", cache_seqlens, (batch,), torch.int32),
        )
        if slots is not None:
            expected += (("slots", slots, (batch * buffers.q.shape[1],), torch.int64),)
        for name, tensor, shape, dtype in expected:
            if tuple(tensor.shape) != shape or tensor.dtype != dtype or tensor.device != buffers.q.device:
                raise MLAInputError(
                    f"{name}: expected {dtype} of shape {list(shape)} on {buffers.q.device} (at most "
                    f"{buffers.block_table.shape[1]} pages per sequence), got {tensor.dtype} {list(tensor.shape)} on {tensor.device}"
                )

    def _fill_for(self, bucket: int, warm_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> None:
        if warm_inputs is None:
            empty = self.buffers.view(0)
            self.buffers.fill(empty.q, empty.block_table, empty.cache_seqlens, None, bucket)
        else:
            q, table, lens = (t[:bucket] for t in warm_inputs)
            self.buffers.fill(q, table, lens, None, bucket)

    def _masked_step(self, view: DecodeBuffers) -> torch.Tensor:
        out = self.step(view)
        mask = view.real_rows.view(-1, *([1] * (out.dim() - 1)))
        return torch.where(mask, out, torch.zeros((), dtype=out.dtype, device=out.device))
