"""`mlakit bench decode --graphs`: eager vs CUDA-graph time per decode step of a whole attention stack.

The stack is DeepSeek-V3's decode attention and nothing else: per layer one `mla_decode` call on
that layer's own paged latent cache (kv_lora_rank 512 + rope 64, bf16, page size 64), no
projections, no MoE. Every layer reads the same query tensor (one shared q: `DecodeGraphs` holds
one q buffer, and the caches differ per layer, so every layer's work is distinct) and the same
block table and lengths, as in an engine where all layers share the page map. Lengths are
random around `context` (uniform within +-`spread`, fixed seed), so the split plan balances
unequal sequences.

Three times per batch, each the median over back-to-back steps of `torch.cuda.Event`
intervals (one interval per step, no host sync between steps, no L2 flush: a step streams
`layers` distinct caches, ~300 MB per step already at batch 1 with the defaults, far beyond
the 50 MB L2 of an H100, so nothing useful stays cached from one step to the next):

- eager: the step's decode metadata, then the `layers` `mla_decode(..., check_inputs=False,
  metadata=...)` calls, the Python an engine runs per step;
- graph: `DecodeGraphs.run(..., check_values=False)` (fill the persistent buffers + replay the
  bucket's graph; no value check, whose host sync would stall every step);
- replay: `graph.replay()` alone, the GPU time of the captured step.

eager - replay is the host overhead (Python, launches) the graph removes; graph - replay is what
is left of it (the buffer fill and one graph launch).

Under torchrun (`--tp-size N`, one process per GPU, `join_ranks`) each rank holds `heads / N`
query heads and, with `--dcp-size M`, its shard of every sequence's cache (`TokenSharding`):
the step is then the rank's `dcp_decode_step` from the global lengths plus, per layer,
`dcp_attention` (all-gather of the DCP group's query heads, decode over the local shard,
all-to-all of partial out and lse, exact merge), all of it in the bucket's graph. A fourth
time, comm, replays a graph of the same step's collectives alone. Rank 0 reports; the
graph-vs-eager error is the worst over the ranks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from mlakit.attention.functional import mla_decode, mla_decode_metadata
from mlakit.bench.ceilings import Ceilings, measure_ceilings
from mlakit.bench.decode import environment
from mlakit.cache.kv_quant import storage_name
from mlakit.config import ServingConfig
from mlakit.distributed import (ParallelGroups, TokenSharding, dcp_attention, dcp_decode_step, exchange_partials,
                                gather_heads)
from mlakit.errors import ConfigError
from mlakit.kernels.seesaw_layout import decode_page_size_hint
from mlakit.serving.graphs import DecodeGraphs, require_capturable
from mlakit.registry.catalog import get_backend
from mlakit.shape import MLAShape

MAX_REL_ERROR = 1e-2
MEMORY_FRACTION = 0.85
DEEPSEEK_V3 = MLAShape.preset("deepseek-v3")
TIMING = (
    "median of per-step torch.cuda.Event intervals over back-to-back steps after warmup; "
    "no L2 flush (each step streams one distinct cache per layer, far beyond L2)"
)

Log = Callable[[str], None]
StackStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class GraphBenchSettings:
    """What the graph benchmark runs: the stack, the batches, the timing loop and the ranks.

    `heads` are all the query heads; each of the `tp_size` ranks holds `heads / tp_size`, and
    each rank of a DCP group of `dcp_size` caches its share of every sequence's tokens, dealt
    `dcp_interleave` at a time.

    >>> s = GraphBenchSettings()
    >>> s.layers, s.heads, s.batches, s.context, s.dim, round(s.softmax_scale, 4)
    (61, 128, (1, 16, 64), 4096, 576, 0.1352)
    >>> GraphBenchSettings(heads=16, q_len=2).max_batch
    64
    >>> GraphBenchSettings(tp_size=8, dcp_size=2, dcp_interleave=16).heads_per_rank
    16
    """

    layers: int = 61
    heads: int = 128
    batches: tuple[int, ...] = (1, 16, 64)
    context: int = 4096
    q_len: int = 1
    backend: str = "triton"
    page_size: int = 64
    kv_lora_rank: int = DEEPSEEK_V3.kv_lora_rank
    rope_dim: int = DEEPSEEK_V3.qk_rope_head_dim
    spread: float = 0.25
    seed: int = 0
    warmup: int = 10
    steps: int = 100
    tp_size: int = 1
    dcp_size: int = 1
    dcp_interleave: int = 1

    def __post_init__(self) -> None:
        positive = {"layers": self.layers, "heads": self.heads, "context": self.context, "q_len": self.q_len,
                    "page_size": self.page_size, "kv_lora_rank": self.kv_lora_rank, "steps": self.steps}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name}: expected a positive number, got {value}")
        if self.rope_dim < 0 or self.warmup < 0:
            raise ValueError(f"rope_dim and warmup: expected >= 0, got {self.rope_dim} and {self.warmup}")
        if not self.batches or min(self.batches) < 1 or len(set(self.batches)) != len(self.batches):
            raise ValueError(f"batches: expected distinct positive batch sizes, got {self.batches}")
        if not 0 <= self.spread < 1:
            raise ValueError(f"spread: expected 0 <= spread < 1, got {self.spread}")
        if self.context < self.q_len:
            raise ValueError(f"context: expected at least q_len ({self.q_len}) tokens, got {self.context}")
        self.serving_config()  # tp_size, dcp_size and dcp_interleave, checked as a ServingConfig's
        if self.heads % self.tp_size:
            raise ValueError(f"heads: expected a multiple of tp_size={self.tp_size} (each rank holds heads / tp_size), got {self.heads}")

    def serving_config(self) -> ServingConfig:
        """The ranks' layout as a ServingConfig (what `join_ranks` starts from)."""
        return ServingConfig(tp_size=self.tp_size, dcp_size=self.dcp_size, dcp_interleave=self.dcp_interleave)

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.tp_size

    @property
    def sharding(self) -> TokenSharding:
        return TokenSharding(self.dcp_size, self.dcp_interleave)

    @property
    def dim(self) -> int:
        """Cache row width: latent plus rope key."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def max_batch(self) -> int:
        return max(self.batches)

    @property
    def softmax_scale(self) -> float:
        """DeepSeek-V3's scale (1/sqrt(192) times the YaRN mscale^2); the same at any TP size."""
        return DEEPSEEK_V3.softmax_scale

    def lengths(self) -> list[int]:
        """Tokens per sequence for the largest batch (a batch of b uses the first b), uniform in
        `context * (1 -+ spread)`, at least `q_len`, from `seed`.

        >>> lens = GraphBenchSettings(context=1000, spread=0.5, batches=(1, 200)).lengths()
        >>> len(lens), min(lens) >= 500, max(lens) <= 1500, lens == GraphBenchSettings(context=1000, spread=0.5, batches=(1, 200)).lengths()
        (200, True, True, True)
        """
        low = max(self.q_len, round(self.context * (1 - self.spread)))
        high = max(low, round(self.context * (1 + self.spread)))
        gen = torch.Generator().manual_seed(self.seed)
        return torch.randint(low, high + 1, (self.max_batch,), generator=gen).tolist()

    def local_lengths(self, dcp_rank: int = 0) -> list[int]:
        """The tokens of each sequence that DCP rank `dcp_rank` caches (all of them without DCP).

        >>> GraphBenchSettings(context=100, spread=0.0, batches=(2,), tp_size=2, dcp_size=2, dcp_interleave=8).local_lengths(1)
        [48, 48]
        """
        return [self.sharding.local_length(n, dcp_rank) for n in self.lengths()]

    def max_pages(self) -> int:
        """Block-table width: the pages of the longest sequence on the fullest rank (DCP rank 0)."""
        return max(-(-n // self.page_size) for n in self.local_lengths())

    def pages_per_layer(self) -> int:
        """Pages one layer's cache holds on every rank: the fullest rank's pages of the largest
        batch plus one spare."""
        return sum(-(-n // self.page_size) for n in self.local_lengths()) + 1

    def cache_bytes(self) -> int:
        """Bytes of all layers' bf16 caches on one rank (~18 GB for the defaults, ~1/dcp_size of it under DCP).

        >>> round(GraphBenchSettings().cache_bytes() / 1e9, 1), round(GraphBenchSettings(tp_size=8, dcp_size=8).cache_bytes() / 1e9, 1)
        (18.6, 2.5)
        """
        return self.layers * self.pages_per_layer() * self.page_size * self.dim * 2

    def exchange_bytes(self, batch: int) -> int:
        """Bytes one rank receives (and sends) per step under DCP, the README's formula: per layer
        `(dcp_size - 1) * tokens * heads_per_rank` times the query row (bf16), the partial
        output (bf16) and its lse (fp32); 0 without DCP.

        >>> GraphBenchSettings(tp_size=8, dcp_size=8, layers=1).exchange_bytes(64)
        15626240
        """
        row = self.dim * 2 + self.kv_lora_rank * 2 + 4
        return self.layers * (self.dcp_size - 1) * batch * self.q_len * self.heads_per_rank * row

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "dim": self.dim, "softmax_scale": self.softmax_scale,
                "kv_dtype": "bf16", "shared_q": True, "cache_bytes": self.cache_bytes(), "timing": TIMING,
                "l2_flush": False}


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One timing loop: median ms per step (CUDA events) and mean host wall ms per step."""

    median_ms: float
    wall_ms: float
    steps: int


@dataclasses.dataclass(frozen=True)
class GraphBatchResult:
    """Eager, graph (fill + replay) and replay-only times of one batch, plus the graph's error;
    under DCP also `comm`, the replay of the step's collectives alone, and `comm_bytes`, what
    one rank receives of them per step (`tokens` are the batch's; `kv_bytes` this rank's reads).

    >>> r = GraphBatchResult(batch=16, layers=61, tokens=65536, kv_bytes=4_600_000_000, rel_error=0.0,
    ...     eager=StepTime(9.0, 9.1, 100), graph=StepTime(6.0, 6.0, 100), replay=StepTime(5.9, 5.9, 100))
    >>> r.saved_ms, r.speedup, round(r.eager_us_per_layer, 1), round(r.host_overhead_ms, 2), r.comm_share
    (3.0, 1.5, 147.5, 3.1, None)
    >>> dcp = dataclasses.replace(r, comm=StepTime(1.18, 1.2, 100), comm_bytes=590_000_000)
    >>> round(dcp.comm_share, 2), round(dcp.comm_gb_per_s)
    (0.2, 500)
    """

    batch: int
    layers: int
    tokens: int
    kv_bytes: int
    rel_error: float
    eager: StepTime
    graph: StepTime
    replay: StepTime
    comm: StepTime | None = None
    comm_bytes: int = 0

    @property
    def saved_ms(self) -> float:
        return self.eager.median_ms - self.graph.median_ms

    @property
    def speedup(self) -> float:
        """Eager time over graph time."""
        return self.eager.median_ms / self.graph.median_ms

    @property
    def eager_us_per_layer(self) -> float:
        return self.eager.median_ms * 1e3 / self.layers

    @property
    def graph_us_per_layer(self) -> float:
        return self.graph.median_ms * 1e3 / self.layers

    @property
    def replay_us_per_layer(self) -> float:
        return self.replay.median_ms * 1e3 / self.layers

    @property
    def host_overhead_ms(self) -> float:
        """Eager step minus the GPU time of the same work: Python and launch cost per step."""
        return self.eager.median_ms - self.replay.median_ms

    @property
    def graph_overhead_ms(self) -> float:
        """What the graph path still adds to the GPU time: the buffer fill and the graph launch."""
        return self.graph.median_ms - self.replay.median_ms

    @property
    def kv_gb_per_s(self) -> float:
        """Cache bytes read per replay over its GPU time."""
        return self.kv_bytes / self.replay.median_ms / 1e6

    @property
    def comm_share(self) -> float | None:
        """The collectives' GPU time over the whole step's (replay); None without DCP."""
        return None if self.comm is None else self.comm.median_ms / self.replay.median_ms

    @property
    def comm_gb_per_s(self) -> float | None:
        """Bytes received per step over the collectives' GPU time; None without DCP."""
        return None if self.comm is None else self.comm_bytes / self.comm.median_ms / 1e6

    @property
    def ok(self) -> bool:
        return self.rel_error <= MAX_REL_ERROR

    def to_json(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        for name in ("saved_ms", "speedup", "eager_us_per_layer", "graph_us_per_layer", "replay_us_per_layer",
                     "host_overhead_ms", "graph_overhead_ms", "kv_gb_per_s", "comm_share", "comm_gb_per_s", "ok"):
            data[name] = getattr(self, name)
        return data


def summary_line(result: GraphBatchResult) -> str:
    """One line per batch for the log.

    >>> r = GraphBatchResult(1, 61, 4000, 281_000_000, 0.0, StepTime(9.15, 9.2, 100), StepTime(0.61, 0.62, 100),
    ...     StepTime(0.6, 0.6, 100))
    >>> summary_line(r)
    'batch 1: eager 9.15 ms/step, graph 0.61 ms/step (replay 0.60 ms GPU), saved 8.54 ms (15.00x); per layer 150.0 / 10.0 / 9.8 us'
    >>> summary_line(dataclasses.replace(r, comm=StepTime(0.15, 0.2, 100), comm_bytes=15_000_000)).split("; ")[-1]
    'collectives 0.15 ms (25% of replay), 15.0 MB in per rank (100 GB/s)'
    """
    line = (
        f"batch {result.batch}: eager {result.eager.median_ms:.2f} ms/step, graph {result.graph.median_ms:.2f} ms/step "
        f"(replay {result.replay.median_ms:.2f} ms GPU), saved {result.saved_ms:.2f} ms ({result.speedup:.2f}x); "
        f"per layer {result.eager_us_per_layer:.1f} / {result.graph_us_per_layer:.1f} / {result.replay_us_per_layer:.1f} us"
    )
    if result.comm is None:
        return line
    return (f"{line}; collectives {result.comm.median_ms:.2f} ms ({100 * result.comm_share:.0f}% of replay), "
            f"{result.comm_bytes / 1e6:.1f} MB in per rank ({result.comm_gb_per_s:.0f} GB/s)")


def format_table(results: Sequence[GraphBatchResult], copy_gb_per_s: float | None = None) -> list[str]:
    """The results table (times in ms per step, per-layer in us); `copy_gb_per_s` adds the replay's share
    of the copy ceiling."""
    header = (f"{'batch':>5} {'tokens':>8} {'eager ms':>9} {'graph ms':>9} {'replay ms':>9} {'saved ms':>9} {'ratio':>6} "
              f"{'eager us/L':>10} {'graph us/L':>10} {'replay us/L':>11} {'KV GB/s':>8} {'% copy':>6} {'rel err':>8}")
    lines = [header]
    for r in results:
        copy = f"{100 * r.kv_gb_per_s / copy_gb_per_s:6.1f}" if copy_gb_per_s else f"{'-':>6}"
        lines.append(
            f"{r.batch:>5} {r.tokens:>8} {r.eager.median_ms:>9.3f} {r.graph.median_ms:>9.3f} {r.replay.median_ms:>9.3f} "
            f"{r.saved_ms:>9.3f} {r.speedup:>5.2f}x {r.eager_us_per_layer:>10.1f} {r.graph_us_per_layer:>10.1f} "
            f"{r.replay_us_per_layer:>11.1f} {r.kv_gb_per_s:>8.0f} {copy} {r.rel_error:>8.1e}"
        )
    return lines


def results_json(settings: GraphBenchSettings, env: dict[str, object], results: Sequence[GraphBatchResult]) -> dict[str, object]:
    """The results file: environment (device, versions, ceilings), settings, one entry per batch.

    >>> data = results_json(GraphBenchSettings(layers=2, batches=(1,)), {"device": "cpu"}, [])
    >>> sorted(data), data["settings"]["layers"], data["settings"]["shared_q"]
    (['environment', 'results', 'settings'], 2, True)
    """
    return {"environment": env, "settings": settings.to_json(), "results": [r.to_json() for r in results]}


@dataclasses.dataclass
class StackInputs:
    """One cache per layer (`[pages, page_size, dim]` bf16), one shared q `[max_batch, q_len, heads, dim]`,
    the block table and lengths of the largest batch (a batch of b uses the first b rows)."""

    caches: list[torch.Tensor]
    q: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor

    def rows(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q[:batch], self.block_table[:batch], self.cache_seqlens[:batch]


def block_table(lengths: Sequence[int], page_size: int, seed: int) -> torch.Tensor:
    """int32 `[batch, max_pages]`: every sequence's pages, taken in shuffled order from one pool
    (page indices `0 .. total - 1`; the spare page `total` stays unused); unused entries are 0
    (at least one column, for a DCP rank that holds no token of any sequence).

    >>> t = block_table([130, 64, 1], page_size=64, seed=0)
    >>> t.shape, sorted(t[0].tolist() + t[1, :1].tolist() + t[2, :1].tolist())
    (torch.Size([3, 3]), [0, 1, 2, 3, 4])
    """
    counts = [-(-n // page_size) for n in lengths]
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(sum(counts), generator=gen).to(torch.int32)
    table = torch.zeros(len(counts), max(1, *counts), dtype=torch.int32)
    start = 0
    for row, count in enumerate(counts):
        table[row, :count] = order[start : start + count]
        start += count
    return table


def make_stack_inputs(settings: GraphBenchSettings, device: torch.device, dcp_rank: int = 0) -> StackInputs:
    """Random N(0, 1) caches and queries (bf16) for the whole stack on DCP rank `dcp_rank`, from
    `settings.seed`: the block table maps the rank's own tokens (`local_lengths`), the lengths
    are the global ones (what a step's metadata starts from), q holds the rank's heads."""
    lengths = settings.lengths()
    table = block_table(settings.local_lengths(dcp_rank), settings.page_size, settings.seed).to(device)
    gen = torch.Generator(device=device).manual_seed(settings.seed)
    pages = settings.pages_per_layer()
    caches = [
        torch.randn(pages, settings.page_size, settings.dim, generator=gen, device=device, dtype=torch.bfloat16)
        for _ in range(settings.layers)
    ]
    q = torch.randn(settings.max_batch, settings.q_len, settings.heads_per_rank, settings.dim, generator=gen, device=device,
                    dtype=torch.bfloat16)
    return StackInputs(caches, q, table, torch.tensor(lengths, dtype=torch.int32, device=device))


def attention_stack(caches: Sequence[torch.Tensor], settings: GraphBenchSettings, check_inputs: bool = False) -> StackStep:
    """The step: the backend's decode metadata built once (`mla_decode_metadata`), then one
    `mla_decode` per layer on that layer's cache (same q, table and lengths); returns the last
    layer's output `[batch, q_len, heads, kv_lora_rank]`."""
    page_size_hint = decode_page_size_hint(caches[0], None, settings.kv_lora_rank)

    def step(q: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out = q
        metadata = mla_decode_metadata(lengths, q_len=q.shape[1], heads=q.shape[2], backend=settings.backend,
                                       kv_cache_dtype=storage_name(caches[0].dtype), page_size=page_size_hint)
        for cache in caches:
            out, _ = mla_decode(q, cache, table, lengths, softmax_scale=settings.softmax_scale, backend=settings.backend,
                                kv_lora_rank=settings.kv_lora_rank, return_lse=False, check_inputs=check_inputs,
                                metadata=metadata)
        return out

    return step


def dcp_attention_stack(caches: Sequence[torch.Tensor], settings: GraphBenchSettings, group: dist.ProcessGroup,
                        check_inputs: bool = False) -> StackStep:
    """The step under DCP, on this rank of the DCP `group`: `dcp_decode_step` from the global
    lengths and the rank's page table, the decode metadata of the group's heads over the local
    shard, then one `dcp_attention` per layer; returns the last layer's output
    `[batch, q_len, heads_per_rank, kv_lora_rank]`.

    With one rank (a group of one) it is `attention_stack` plus two collectives per layer:

    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> settings = GraphBenchSettings(layers=2, heads=4, batches=(2,), context=40, page_size=16, backend="reference")
    >>> inputs = make_stack_inputs(settings, torch.device("cpu"))
    >>> out = dcp_attention_stack(inputs.caches, settings, dist.group.WORLD)(*inputs.rows(2))
    >>> out.shape, relative_error(out, attention_stack(inputs.caches, settings)(*inputs.rows(2))) < 1e-2
    (torch.Size([2, 1, 4, 512]), True)
    >>> dist.destroy_process_group()
    """
    sharding, rank = TokenSharding(dist.get_world_size(group), settings.dcp_interleave), dist.get_rank(group)
    page_size_hint = decode_page_size_hint(caches[0], None, settings.kv_lora_rank)

    def step(q: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        dcp = dcp_decode_step(sharding, rank, table, lengths, q_len=q.shape[1], page_size=settings.page_size)
        tokens = q.flatten(0, 1)
        metadata = mla_decode_metadata(dcp.visible, q_len=1, heads=tokens.shape[1] * sharding.dcp_size,
                                       backend=settings.backend, kv_cache_dtype=storage_name(caches[0].dtype),
                                       page_size=page_size_hint)
        out = tokens
        for cache in caches:
            out, _ = dcp_attention(tokens, cache, dcp, group, kv_lora_rank=settings.kv_lora_rank,
                                   softmax_scale=settings.softmax_scale, backend=settings.backend,
                                   check_inputs=check_inputs, metadata=metadata)
        return out.unflatten(0, q.shape[:2])

    return step


def exchange_stack(settings: GraphBenchSettings, group: dist.ProcessGroup) -> StackStep:
    """The DCP step's communication alone: per layer the all-gather of the query heads and the
    all-to-all of partial out (bf16) packed with its lse (fp32) that `dcp_attention` runs (with
    the packing copies), on tensors of the same shapes and no attention; returns the last gathered queries `[batch, q_len, group heads, dim]`.

    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> q = torch.ones(3, 2, 4, 576, dtype=torch.bfloat16)
    >>> exchange_stack(GraphBenchSettings(layers=2), dist.group.WORLD)(q, None, None).shape
    torch.Size([3, 2, 4, 576])
    >>> dist.destroy_process_group()
    """
    size = dist.get_world_size(group)

    def step(q: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        tokens = q.flatten(0, 1)
        out = tokens.new_zeros(tokens.shape[0], size * tokens.shape[1], settings.kv_lora_rank)
        lse = torch.zeros(out.shape[:-1], device=q.device)
        gathered = tokens
        for _ in range(settings.layers):
            gathered = gather_heads(tokens, group)
            exchange_partials(out, lse, group)
        return gathered.unflatten(0, q.shape[:2])

    return step


def make_stack(caches: Sequence[torch.Tensor], settings: GraphBenchSettings, dcp_group: dist.ProcessGroup | None,
               check_inputs: bool = False) -> StackStep:
    """`dcp_attention_stack` on `dcp_group`, or `attention_stack` where there is none (DCP size 1)."""
    if dcp_group is None:
        return attention_stack(caches, settings, check_inputs)
    return dcp_attention_stack(caches, settings, dcp_group, check_inputs)


def time_step(fn: Callable[[], object], warmup: int, steps: int) -> StepTime:
    """Median of per-step CUDA-event intervals over `steps` back-to-back calls (no sync between
    them, no L2 flush), and the mean host wall time per step of the same loop."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    began = time.perf_counter()
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - began) * 1e3 / steps
    return StepTime(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)), wall_ms, steps)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """`|got - want| / |want|` in float32 (0 when both are zero).

    >>> relative_error(torch.ones(4), torch.ones(4)), relative_error(torch.zeros(2), torch.zeros(2))
    (0.0, 0.0)
    """
    want32 = want.float()
    diff = float((got.float() - want32).norm())
    norm = float(want32.norm())
    return diff / norm if norm else diff


def _replay_of(graphs: DecodeGraphs, batch: int) -> Callable[[], None]:
    """The replay alone of `batch`'s bucket (the buffers as the last fill left them)."""
    return lambda: graphs.replay(batch)


def check_backend(settings: GraphBenchSettings) -> None:
    """Raises ConfigError when the backend cannot be captured, or, under DCP, returns no lse.

    >>> check_backend(GraphBenchSettings(tp_size=2, dcp_size=2))
    >>> check_backend(GraphBenchSettings(tp_size=2, dcp_size=2, backend="intel_xpu"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mlakit.errors.ConfigError: backend 'intel_xpu' cannot be captured in a CUDA graph ...
    """
    require_capturable(settings.backend)
    if settings.dcp_size > 1 and not get_backend(settings.backend).record.returns_lse:
        raise ConfigError(
            f"backend {settings.backend!r} does not return the log-sum-exp, which DCP merges the ranks' partial "
            "results by: pick a decode backend that returns it (triton, reference) or --dcp-size 1"
        )


def worst_over_ranks(value: float, parallel: ParallelGroups | None, device: torch.device) -> float:
    """The largest `value` over every rank (an all-reduce); `value` itself in one process.

    >>> worst_over_ranks(0.5, None, torch.device("cpu"))
    0.5
    """
    if parallel is None:
        return value
    found = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX, group=parallel.tp_group)
    return float(found)


def capture_stack(step: StackStep, settings: GraphBenchSettings, device: torch.device, inputs: StackInputs) -> DecodeGraphs:
    """`step` captured in one graph per batch (the batches are the buckets), warmed on `inputs`."""
    graphs = DecodeGraphs(
        lambda b: step(b.q, b.block_table, b.cache_seqlens), backend=settings.backend, max_batch=settings.max_batch,
        q_len=settings.q_len, heads=settings.heads_per_rank, dim=settings.dim, max_pages=settings.max_pages(),
        page_size=settings.page_size, num_pages=settings.pages_per_layer(), dtype=torch.bfloat16, device=device,
        buckets=settings.batches,
    )
    graphs.capture(warm_inputs=(inputs.q, inputs.block_table, inputs.cache_seqlens))
    return graphs


def run_graph_bench(settings: GraphBenchSettings, device: torch.device, log: Log, memory_budget: float | None = None,
                    parallel: ParallelGroups | None = None) -> list[GraphBatchResult]:
    """Builds the stack, captures one graph per batch (buckets = the batches), checks the graph's
    output against the eager step's, then times eager, graph and replay for every batch.

    `memory_budget` (bytes) refuses settings whose caches would not fit. `parallel`: this
    torchrun rank's groups (`join_ranks`), matching `settings.tp_size` / `dcp_size`; every rank
    must call this together (the steps run collectives). On an H100:
    `run_graph_bench(GraphBenchSettings(heads=16), torch.device("cuda"), print, 0.85 * 80e9)`.
    """
    need = settings.cache_bytes()
    if memory_budget is not None and need > memory_budget:
        raise ConfigError(
            f"{settings.layers} caches of {settings.max_batch} x ~{settings.context} tokens need {need / 1e9:.1f} GB, "
            f"more than the {memory_budget / 1e9:.1f} GB budget: lower --graph-context, --graph-layers or the batches"
        )
    check_backend(settings)  # before gigabytes are allocated
    dcp_group = parallel.dcp_group if parallel is not None and parallel.dcp_size > 1 else None
    if dcp_group is not None and device.type == "cuda" and dist.get_backend(dcp_group) != "nccl":
        raise ConfigError(
            f"CUDA graphs capture the DCP collectives over NCCL only, and this group runs {dist.get_backend(dcp_group)} "
            "(fewer GPUs than ranks): start one rank per GPU"
        )
    log(f"allocating {settings.layers} caches x {settings.pages_per_layer()} pages x {settings.page_size} x "
        f"{settings.dim} bf16 = {need / 1e9:.1f} GB per rank; one shared q [{settings.max_batch}, {settings.q_len}, "
        f"{settings.heads_per_rank}, {settings.dim}]")
    inputs = make_stack_inputs(settings, device, parallel.dcp_rank if parallel is not None else 0)
    # One call with the value checks (page indices in range, lengths within the table) before timing.
    make_stack(inputs.caches[:1], settings, dcp_group, check_inputs=True)(*inputs.rows(settings.max_batch))
    step = make_stack(inputs.caches, settings, dcp_group)
    log(f"capturing {settings.layers}-layer decode graphs for buckets {tuple(sorted(settings.batches))} ({settings.backend}"
        f"{f', TP{settings.tp_size} x DCP{settings.dcp_size}, interleave {settings.dcp_interleave}' if dcp_group else ''})")
    graphs = capture_stack(step, settings, device, inputs)
    exchange = None if dcp_group is None else capture_stack(exchange_stack(settings, dcp_group), settings, device, inputs)
    results = []
    for batch in sorted(settings.batches):
        result = _time_batch(settings, inputs, step, graphs, exchange, batch, parallel)
        results.append(result)
        check = "ok" if result.ok else f"MISMATCH (> {MAX_REL_ERROR:.0e})"
        log(f"{summary_line(result)}; graph vs eager (last layer) rel err {result.rel_error:.1e} {check}")
    return results


def _time_batch(settings: GraphBenchSettings, inputs: StackInputs, step: StackStep, graphs: DecodeGraphs,
                exchange: DecodeGraphs | None, batch: int, parallel: ParallelGroups | None) -> GraphBatchResult:
    """The first replay against the eager step (worst over the ranks), then the timing loops of one batch.
    The graph runs skip the value checks (their host sync would be timed; under DCP the lengths are global,
    the table a rank's): the eager call with checks in `run_graph_bench` has read the same rows."""
    q, table, lengths = inputs.rows(batch)
    eager_step = functools.partial(step, q, table, lengths)
    graph_step = functools.partial(graphs.run, q, table, lengths, check_values=False)
    eager_out = eager_step().clone()
    graph_out = graph_step().clone()
    error = worst_over_ranks(relative_error(graph_out, eager_out), parallel, q.device)
    del eager_out, graph_out
    eager = time_step(eager_step, settings.warmup, settings.steps)
    graph = time_step(graph_step, settings.warmup, settings.steps)
    graph_step()  # the buffers hold this batch for the replays
    replay = time_step(_replay_of(graphs, batch), settings.warmup, settings.steps)
    comm = None
    if exchange is not None:
        exchange.run(q, table, lengths, check_values=False)
        comm = time_step(_replay_of(exchange, batch), settings.warmup, settings.steps)
    dcp_rank = parallel.dcp_rank if parallel is not None else 0
    local_tokens = sum(settings.local_lengths(dcp_rank)[:batch])
    return GraphBatchResult(batch, settings.layers, sum(settings.lengths()[:batch]),
                            settings.layers * local_tokens * settings.dim * 2, error, eager, graph, replay,
                            comm, settings.exchange_bytes(batch) if comm is not None else 0)


def _quiet(line: str) -> None:
    """The log of every rank but rank 0."""


def run_and_report(settings: GraphBenchSettings, device: torch.device, json_path: Path, log: Log,
                   parallel: ParallelGroups | None = None) -> list[GraphBatchResult]:
    """Measures the ceilings, runs the benchmark, logs the table and writes the JSON file; under
    torchrun (`parallel`, every rank calls it) only rank 0 logs and writes.

    On a CUDA device: `run_and_report(GraphBenchSettings(), torch.device("cuda"), Path("out.json"), print)`.
    """
    if parallel is not None and parallel.rank != 0:
        log = _quiet
    ceilings: Ceilings = measure_ceilings(device)
    log(f"ceilings: copy {ceilings.copy_gb_per_s:.0f} GB/s, bf16 matmul {ceilings.matmul_tflop_per_s:.0f} TFLOP/s")
    budget = None
    if device.type == "cuda":
        budget = MEMORY_FRACTION * torch.cuda.get_device_properties(device).total_memory
    results = run_graph_bench(settings, device, log, budget, parallel)
    log(f"{settings.layers}-layer attention stack, {settings.heads_per_rank} of {settings.heads} heads per rank "
        f"(TP{settings.tp_size} x DCP{settings.dcp_size}), q_len {settings.q_len}, context ~{settings.context}, "
        f"backend {settings.backend}:")
    for line in format_table(results, ceilings.copy_gb_per_s):
        log(line)
    if parallel is None or parallel.rank == 0:
        env = {**environment(device, ceilings), "world_size": settings.tp_size,
               "process_group": dist.get_backend() if parallel is not None else None}
        json_path.write_text(json.dumps(results_json(settings, env, results), indent=1))
        log(f"wrote {json_path}")
    return results
