"""`mlakit bench decode`: decode kernels timed against the copy and matmul ceilings.

Method (the same as benchmarks/anchors_h100.json): one decode call captured in a CUDA
graph, median of `triton.testing.do_bench` over replays (L2 flushed before each), random
N(0, 1) data, every case first checked against the reference. Per-step metadata (our split
plan, FlashMLA's scheduler metadata in the anchors) is built before the timed call.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from mlakit.bench.ceilings import Ceilings
from mlakit.bench.timing import clean_l2_ms, eager_us, host_us_per_call, median_ms, sustained_ms
from mlakit.cache.kv_quant import FP8_DTYPE, STORAGE_DTYPES
from mlakit.serving.graphs import capture_graph

KV_LORA_RANK, ROPE_DIM = 512, 64
DIM = KV_LORA_RANK + ROPE_DIM
RAGGED_BATCH, RAGGED_LOW, RAGGED_HIGH, RAGGED_SEED = 64, 256, 16384, 0
# An uneven batch's lengths lie within this fraction of its seqlen either way: uneven, and usually not ragged for the
# split plan (its longest sequence within 1.25x the mean; a few small batches' draws exceed it).
UNEVEN_SPREAD = 0.2
ANCHORS = Path(__file__).resolve().parents[3] / "benchmarks" / "anchors_h100.json"


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    """One benchmark case; `seqlen=None` is the ragged batch; `uneven` draws each length within UNEVEN_SPREAD of
    `seqlen` (seeded by the shape)."""

    heads: int
    batch: int
    seqlen: int | None
    q_len: int = 1
    kv_dtype: str = "bf16"
    page_size: int = 64
    uneven: bool = False

    def __post_init__(self) -> None:
        counts = {"heads": self.heads, "batch": self.batch, "q_len": self.q_len, "page_size": self.page_size}
        if self.seqlen is not None:
            counts["seqlen"] = self.seqlen
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"case {name}: expected a positive integer, got {value}")
        if self.kv_dtype not in STORAGE_DTYPES:
            raise ValueError(f"case kv_dtype: expected one of {', '.join(STORAGE_DTYPES)}, got {self.kv_dtype!r}")
        if self.uneven and self.seqlen is None:
            raise ValueError("case uneven: expected a seqlen to draw lengths around, got the ragged batch")

    @classmethod
    def parse(cls, spec: str) -> DecodeCase:
        """A case from `heads,batch,seqlen|~seqlen|ragged,q_len[,kv_dtype[,page_size]]` (bf16 and 64 when left out;
        `~seqlen` an uneven batch around seqlen).

        >>> DecodeCase.parse("128,64,ragged,2,fp8_e4m3,64").label, DecodeCase.parse("16,16,4096,1").label
        ('h128 ragged q2 fp8_e4m3 p64', 'h16 16x4096 q1 bf16 p64')
        >>> DecodeCase.parse("128,40,~8192,2").label
        'h128 40x~8192 q2 bf16 p64'
        """
        shape = ValueError(f"case {spec!r}: expected heads,batch,seqlen|~seqlen|ragged,q_len[,kv_dtype[,page_size]] "
                           f"(integers but for seqlen 'ragged' and kv_dtype)")
        fields = [f.strip() for f in spec.split(",")]
        if not 4 <= len(fields) <= 6:
            raise shape
        defaults = [cls.kv_dtype, str(cls.page_size)]
        heads, batch, seqlen, q_len, kv_dtype, page_size = fields + defaults[len(fields) - 4:]
        uneven = seqlen.startswith("~")
        seqlen = seqlen.removeprefix("~")
        if not all(f.isdigit() for f in (heads, batch, q_len, page_size, *([] if seqlen == "ragged" else [seqlen]))):
            raise shape
        return cls(int(heads), int(batch), None if seqlen == "ragged" else int(seqlen), int(q_len), kv_dtype,
                   int(page_size), uneven)

    @property
    def label(self) -> str:
        shape = "ragged" if self.seqlen is None else f"{self.batch}x{'~' if self.uneven else ''}{self.seqlen}"
        return f"h{self.heads} {shape} q{self.q_len} {self.kv_dtype} p{self.page_size}"

    @property
    def anchor_key(self) -> tuple[int, int, int | None] | None:
        """The shape's key in the anchors (`anchor_times`); None for an uneven batch, whose lengths no anchor drew.

        >>> DecodeCase(128, 64, 4096).anchor_key, DecodeCase(128, 64, 4096, uneven=True).anchor_key
        ((128, 64, 4096), None)
        """
        return None if self.uneven else (self.heads, self.batch, self.seqlen)

    def lengths(self) -> list[int]:
        """The batch's cached tokens per sequence.

        >>> lengths = DecodeCase(16, 80, 16384, uneven=True).lengths()
        >>> len(lengths), 0.8 * 16384 <= min(lengths) < max(lengths) <= 1.2 * 16384
        (80, True)
        """
        if self.seqlen is None:
            gen = torch.Generator().manual_seed(RAGGED_SEED)
            return torch.randint(RAGGED_LOW, RAGGED_HIGH + 1, (RAGGED_BATCH,), generator=gen).tolist()
        if not self.uneven:
            return [self.seqlen] * self.batch
        gen = torch.Generator().manual_seed(self.batch * 7919 + self.seqlen)
        factors = 1 + UNEVEN_SPREAD * (2 * torch.rand(self.batch, generator=gen) - 1)
        return (factors * self.seqlen).round().int().clamp(min=1).tolist()


@dataclasses.dataclass
class DecodeInputs:
    q: torch.Tensor
    kv_cache: torch.Tensor
    kv_scale: torch.Tensor | None
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    softmax_scale: float = 192**-0.5


def make_inputs(case: DecodeCase, device: torch.device, seed: int = 0) -> DecodeInputs:
    """Random cache pages in shuffled order holding exactly the case's tokens."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lengths = case.lengths()
    pages_per_seq = [-(-n // case.page_size) for n in lengths]
    num_pages = sum(pages_per_seq)
    order = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    table = torch.zeros(len(lengths), max(pages_per_seq), dtype=torch.int32, device=device)
    start = 0
    for b, count in enumerate(pages_per_seq):
        table[b, :count] = order[start : start + count]
        start += count
    values = torch.randn(num_pages, case.page_size, DIM, generator=gen, device=device, dtype=torch.bfloat16)
    scale = None
    if case.kv_dtype == "fp8_e4m3":
        scale = torch.ones(1, dtype=torch.float32, device=device)
        values = values.to(FP8_DTYPE)
    else:
        values = values.to(STORAGE_DTYPES[case.kv_dtype])
    q = torch.randn(len(lengths), case.q_len, case.heads, DIM, generator=gen, device=device, dtype=torch.bfloat16)
    return DecodeInputs(q, values, scale, table, torch.tensor(lengths, dtype=torch.int32, device=device))


def case_cost(case: DecodeCase) -> tuple[int, int]:
    """(KV bytes read at least once, FLOPs) of one decode call."""
    tokens = sum(case.lengths())
    element = 1 if case.kv_dtype == "fp8_e4m3" else 2
    flops = 2 * case.heads * case.q_len * tokens * (KV_LORA_RANK + DIM)
    return tokens * DIM * element, flops


class CaseNotSupported(Exception):
    """A kernel cannot run this case (its backend refuses the page size, KV dtype, heads or q_len); the
    reasons are the message."""


DecodeCall = Callable[[], tuple[torch.Tensor, torch.Tensor | None]]
# Prepares a kernel for one batch (per-step metadata such as split plans, built outside
# the timed region as in the anchors) and returns the call that is timed.
KernelFactory = Callable[[DecodeInputs], DecodeCall]


# How `time_graph_replay` times a replay, by the name results files give the timing.
REPLAY_TIMERS: dict[str, Callable[[Callable[[], object]], float]] = {
    "flushed": lambda replay: median_ms(replay, rep_ms=200),
    "clean-l2": lambda replay: clean_l2_ms(replay, rep_ms=200),
    "sustained": sustained_ms,
}


def time_graph_replay(call: DecodeCall, timing: str = "flushed") -> float:
    """Microseconds of a CUDA-graph replay of one call, timed as `timing` names (`REPLAY_TIMERS`): do_bench's median
    with the L2 flushed (left dirty) before each replay, the median with a clean L2 before each
    (`timing.clean_l2_ms`), or the mean of replays back to back once the clock has settled (`timing.sustained_ms`;
    a cache that fits L2 then stays there between replays)."""
    graph, _ = capture_graph(call, warmup=1)
    return REPLAY_TIMERS[timing](graph.replay) * 1e3


def check_against_reference(factory: KernelFactory, inputs: DecodeInputs, max_tokens: int = 1 << 19,
                            reference_queries: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """Relative error of the kernel against the fp32 reference on the first sequences (bounded work); the reference
    sees `reference_queries(q)` where given (e.g. `mlakit.reference.e4m3_rounded_queries`: what a kernel that
    rounds its queries computes)."""
    from mlakit.reference import reference_decode

    keep = max(1, int((inputs.cache_seqlens.cumsum(0) <= max_tokens).sum()))
    sub = dataclasses.replace(
        inputs, q=inputs.q[:keep], block_table=inputs.block_table[:keep], cache_seqlens=inputs.cache_seqlens[:keep]
    )
    out, _ = factory(sub)()
    ref, _ = reference_decode(
        sub.q if reference_queries is None else reference_queries(sub.q), sub.kv_cache, sub.block_table, sub.cache_seqlens,
        kv_lora_rank=KV_LORA_RANK, softmax_scale=sub.softmax_scale, kv_scale=sub.kv_scale,
    )
    return float((out.float() - ref).norm() / ref.norm())


def run_cases(
    cases: Iterable[DecodeCase],
    kernels: dict[str, KernelFactory],
    device: torch.device,
    ceilings: Ceilings,
    log: Callable[[str], None],
    timing: str = "flushed",
) -> list[dict[str, object]]:
    """Checks then times every kernel on every case (CUDA-graph replay, `time_graph_replay` as `timing` names; and
    outside a graph, the host time per call of a loop without sync and the eager do_bench time); one result row
    per (case, kernel), with `x_first`, the time over the first kernel's on the same case. A kernel whose
    preparation raises CaseNotSupported is skipped for that case, with its reason in the log."""
    anchors, anchor_ragged_tokens = anchor_times()
    rows = []
    for case in cases:
        inputs = make_inputs(case, device)
        kv_bytes, flops = case_cost(case)
        floor_us = max(kv_bytes / (ceilings.copy_gb_per_s * 1e3), flops / (ceilings.matmul_tflop_per_s * 1e6))
        first_us = None
        for index, (name, factory) in enumerate(kernels.items()):
            try:
                error = check_against_reference(factory, inputs)
                call = factory(inputs)
                time_us = time_graph_replay(call, timing)
                host_us, eager = host_us_per_call(call), eager_us(call)
            except CaseNotSupported as exc:
                log(f"{case.label:<28} {name:<10} skipped: {exc}")
                continue
            except Exception as exc:  # a variant that cannot launch (e.g. out of shared memory) is reported, not fatal
                log(f"{case.label:<28} {name:<10} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            first_us = time_us if index == 0 else first_us
            row = {
                "case": case.label, **dataclasses.asdict(case), "kernel": name, "rel_error": error,
                "time_us": time_us, "host_us": host_us, "eager_us": eager, "floor_us": floor_us, "x_floor": time_us / floor_us,
                "kv_gb_per_s": kv_bytes / time_us / 1e3, "tflop_per_s": flops / time_us / 1e6,
                "copy_ratio": kv_bytes / time_us / 1e3 / ceilings.copy_gb_per_s,
                "matmul_ratio": flops / time_us / 1e6 / ceilings.matmul_tflop_per_s,
            }
            if first_us is not None:
                row["x_first"] = time_us / first_us
            anchor = anchors.get(case.anchor_key)
            if anchor and case.q_len in (1, 2) and case.kv_dtype == "bf16":
                flashmla_us = anchor[f"flashmla_q{case.q_len}_us"] * anchor_token_scale(case, anchor_ragged_tokens)
                row["flashmla_us_anchor"] = flashmla_us
                row["x_flashmla_anchor"] = time_us / flashmla_us
            rows.append(row)
            log(_format_row(row))
        del inputs
        torch.cuda.empty_cache()
    return rows


def anchor_token_scale(case: DecodeCase, anchor_ragged_tokens: int) -> float:
    """What an anchor time of `case`'s shape is multiplied by: 1, except for the ragged batch, whose anchor
    drew other lengths from the same distribution: its time is scaled to our batch's tokens."""
    return sum(case.lengths()) / anchor_ragged_tokens if case.seqlen is None else 1.0


def anchor_times(path: Path = ANCHORS) -> tuple[dict[tuple[int, int, int | None], dict[str, float]], int]:
    """Anchor rows by (heads, batch, seqlen), and the token count of the anchors' ragged batch."""
    if not path.is_file():
        return {}, 1
    data = json.loads(path.read_text())
    cases = {(c["heads"], c["batch"], None if c["seqlen"] == "ragged" else c["seqlen"]): c for c in data["cases"]}
    return cases, data["ragged"]["total_tokens"]


def _format_row(row: dict[str, object]) -> str:
    anchor = f"{row['x_first']:.3f}x first" if "x_first" in row else ""
    anchor += f"  {row['x_flashmla_anchor']:.2f}x FlashMLA anchor" if "x_flashmla_anchor" in row else ""
    return (
        f"{row['case']:<28} {row['kernel']:<10} {row['time_us']:9.1f} us  {row['x_floor']:5.2f}x floor  "
        f"eager {row['eager_us']:7.1f} us  host {row['host_us']:6.1f} us  "
        f"{row['copy_ratio'] * 100:5.1f}% copy  {row['matmul_ratio'] * 100:5.1f}% matmul  err {row['rel_error']:.1e}  {anchor}"
    )


def environment(device: torch.device, ceilings: Ceilings) -> dict[str, object]:
    """Device, versions, date and ceilings for a results file."""
    import triton

    return {
        "device": torch.cuda.get_device_name(device),
        "sms": torch.cuda.get_device_properties(device).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ceilings": dataclasses.asdict(ceilings),
    }


def write_results(path: Path, env: dict[str, object], rows: list[dict[str, object]]) -> None:
    path.write_text(json.dumps({"environment": env, "results": rows}, indent=1))


def plot_results(path: Path, rows: list[dict[str, object]]) -> None:
    """Time over floor per case, one bar per kernel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    width = 0.8 / len(kernels)
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.45), 5))
    for k, kernel in enumerate(kernels):
        by_case = {r["case"]: r["x_floor"] for r in rows if r["kernel"] == kernel}
        ax.bar([i + k * width for i in range(len(cases))], [by_case.get(c, 0) for c in cases], width, label=kernel)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=75, fontsize=7)
    ax.set_ylabel("time / floor (lower is better)")
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def default_cases(quick: bool) -> list[DecodeCase]:
    """The issue's grid (quick: the ANCHORS rows at q_len 1/2 plus fp8 and q_len 4 spot checks)."""
    if quick:
        shapes = [(1, 4096), (1, 16384), (16, 4096), (64, 4096), (64, None), (128, 16384)]
        cases = [DecodeCase(h, b, n, q) for h in (128, 16) for b, n in shapes for q in (1, 2)]
        cases += [DecodeCase(h, 64, 4096, 1, "fp8_e4m3") for h in (128, 16)]
        cases += [DecodeCase(128, 64, 4096, 4), DecodeCase(64, 64, 4096, 1)]
        return cases + page_size_one_cases()
    shapes = [(b, n) for b in (1, 16, 64, 128) for n in (1024, 4096, 16384)] + [(64, None)]
    grid = [
        DecodeCase(h, b, n, q, dtype)
        for h in (128, 64, 16)
        for b, n in shapes
        for q in (1, 2, 4)
        for dtype in ("bf16", "fp8_e4m3")
    ]
    return grid + page_size_one_cases()


def page_size_one_cases() -> list[DecodeCase]:
    """Page size 1, where the simple engines' kernels run (the yardstick's home ground)."""
    return [DecodeCase(h, 64, 4096, 1, "bf16", 1) for h in (128, 16)]
