"""`mlakit bench overhead`: what one eager call costs the host, beside what its kernels cost the GPU.

Per call, three numbers, all on the same inputs with the per-step metadata built beforehand:

- host: the mean host time of a loop of `calls` calls without a sync (what a step of many
  layers pays on the CPU while the GPU keeps up; `calls` stays below the launch queue's depth);
- eager: `triton.testing.do_bench`'s median of the eager call (whichever of host and GPU is slower);
- graph: the median replay of the call captured in a CUDA graph (the kernels alone).

Calls: `mla_decode` with metadata (check_inputs=False, with `out=`, and the default
check_inputs=True), `mla_extend` with metadata and `mla_prefill` (each allocating, and with `out=`), the
drop-in entry points (`mlakit.compat.flash_mla.flash_mla_with_kvcache`, `mlakit.compat.flashinfer`'s
`run`), and, where installed, FlashMLA's `flash_mla_with_kvcache` and FlashInfer's `run` (fa3 and fa2).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import torch

from mlakit.attention.functional import mla_decode, mla_decode_metadata, mla_extend, mla_extend_metadata, mla_prefill
from mlakit.bench.decode import DIM, KV_LORA_RANK, DecodeCase, DecodeInputs, make_inputs, time_graph_replay
from mlakit.bench.timing import CALLS, eager_us, host_us_per_call
from mlakit.prefill.metadata import plan_prefill

FLASHINFER_BACKENDS = ("fa3", "fa2")
NOPE_DIM, V_DIM = 128, 128
# Calls under the profiler for `host_profile`.
PROFILE_CALLS = 200

Call = Callable[[], object]


@dataclasses.dataclass(frozen=True)
class OverheadCase:
    """`kind` "decode" (`new` query tokens per sequence), "extend" (`new` new tokens per sequence, packed)
    or "prefill" (`new` new tokens after `seqlen - new` cached ones, MHA form), over `batch` sequences
    of `seqlen` cached tokens, `heads` heads.

    >>> OverheadCase("decode", 128, 64, 4096, 2).label
    'decode h128 64x4096 q2'
    """

    kind: str
    heads: int
    batch: int
    seqlen: int
    new: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("decode", "extend", "prefill"):
            raise ValueError(f"kind: expected decode, extend or prefill, got {self.kind!r}")
        if min(self.heads, self.batch, self.new) < 1 or self.seqlen < self.new:
            raise ValueError(f"expected heads, batch and new >= 1 and seqlen >= new, got {self}")

    @property
    def label(self) -> str:
        return f"{self.kind} h{self.heads} {self.batch}x{self.seqlen} q{self.new}"

    @classmethod
    def parse(cls, spec: str) -> OverheadCase:
        """A case from `kind,heads,batch,seqlen,new`.

        >>> OverheadCase.parse("extend,16,8,1024,4")
        OverheadCase(kind='extend', heads=16, batch=8, seqlen=1024, new=4)
        """
        kind, *numbers = spec.split(",")
        if len(numbers) != 4 or not all(n.isdigit() for n in numbers):
            raise ValueError(f"expected kind,heads,batch,seqlen,new, got {spec!r}")
        return cls(kind, *map(int, numbers))


def default_cases() -> list[OverheadCase]:
    """The issue's grid: decode at 16 and 128 heads, q_len 1 and 2, batch 1 x 1024 and 64 x 4096; extend
    of 4 new tokens over 8 x 1024; prefill of 512 new tokens, alone and after a 4096-token prefix, and of
    128 tokens (a prompt short enough for the host to be the bottleneck)."""
    decode = [OverheadCase("decode", heads, batch, seqlen, q_len)
              for heads in (16, 128) for q_len in (1, 2) for batch, seqlen in ((1, 1024), (64, 4096))]
    extend = [OverheadCase("extend", heads, 8, 1024, 4) for heads in (16, 128)]
    prefill = [OverheadCase("prefill", 128, 1, 512, 512), OverheadCase("prefill", 16, 1, 4608, 512),
               OverheadCase("prefill", 128, 1, 128, 128), OverheadCase("prefill", 16, 1, 128, 128)]
    return decode + extend + prefill


def measure(call: Call, calls: int = CALLS) -> dict[str, float | None]:
    """Host, eager and graph microseconds of one call (graph None where the call cannot be captured)."""
    host = host_us_per_call(call, calls)
    eager = eager_us(call)
    try:
        graph = time_graph_replay(call)
    except Exception:  # a peer whose call syncs or allocates on the host cannot be captured
        graph = None
    return {"host_us": host, "eager_us": eager, "graph_us": graph}


def case_calls(case: OverheadCase, device: torch.device) -> dict[str, Call]:
    """The timed calls of one case, each with its per-step metadata built here."""
    if case.kind == "prefill":
        return _prefill_calls(case, device)
    inputs = make_inputs(DecodeCase(case.heads, case.batch, case.seqlen, case.new), device)
    calls = _decode_calls(inputs) if case.kind == "decode" else _extend_calls(inputs)
    calls.update(_peer_calls(inputs, with_flashmla=case.kind == "decode"))
    return calls


def _decode_calls(x: DecodeInputs) -> dict[str, Call]:
    from mlakit.compat import flash_mla as compat_flash_mla

    batch, q_len, heads, _ = x.q.shape
    md = mla_decode_metadata(x.cache_seqlens, q_len=q_len, heads=heads, backend="triton", page_size=x.kv_cache.shape[1])
    out = torch.empty(batch, q_len, heads, KV_LORA_RANK, dtype=x.q.dtype, device=x.q.device)
    lse = torch.empty(batch, heads, q_len, dtype=torch.float32, device=x.q.device)
    common = dict(softmax_scale=x.softmax_scale, backend="triton", metadata=md)
    schedule, num_splits = compat_flash_mla.get_mla_metadata()
    k_cache = x.kv_cache.unsqueeze(2)
    return {
        "mla_decode": lambda: mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, check_inputs=False, **common),
        "mla_decode out=": lambda: mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, check_inputs=False,
                                              out=out, lse=lse, **common),
        "mla_decode checked": lambda: mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, **common),
        "compat flash_mla_with_kvcache": lambda: compat_flash_mla.flash_mla_with_kvcache(
            x.q, k_cache, x.block_table, x.cache_seqlens, KV_LORA_RANK, schedule, num_splits,
            softmax_scale=x.softmax_scale, causal=True),
        **_compat_flashinfer_call(x),
    }


def _extend_calls(x: DecodeInputs) -> dict[str, Call]:
    batch, new, heads, _ = x.q.shape
    q = x.q.reshape(batch * new, heads, DIM)
    cu_seqlens_q = torch.arange(0, (batch + 1) * new, new, dtype=torch.int32, device=q.device)
    md = mla_extend_metadata(x.cache_seqlens, cu_seqlens_q, max_q_len=new, heads=heads, backend="triton",
                             page_size=x.kv_cache.shape[1])
    out = torch.empty(batch * new, heads, KV_LORA_RANK, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch * new, heads, dtype=torch.float32, device=q.device)
    common = dict(max_q_len=new, softmax_scale=x.softmax_scale, backend="triton", check_inputs=False, metadata=md)
    return {
        "mla_extend": lambda: mla_extend(q, x.kv_cache, x.block_table, x.cache_seqlens, cu_seqlens_q, **common),
        "mla_extend out=": lambda: mla_extend(q, x.kv_cache, x.block_table, x.cache_seqlens, cu_seqlens_q, out=out,
                                              lse=lse, **common),
        **_compat_flashinfer_call(x),
    }


def _compat_flashinfer_call(x: DecodeInputs) -> dict[str, Call]:
    from mlakit.compat import flashinfer as compat_flashinfer

    return {"compat flashinfer run": _flashinfer_run(compat_flashinfer.BatchMLAPagedAttentionWrapper, x, {})}


def _peer_calls(x: DecodeInputs, with_flashmla: bool) -> dict[str, Call]:
    from mlakit.bench.peers import _flashmla_call

    calls: dict[str, Call] = {}
    if with_flashmla and importlib.util.find_spec("flash_mla") is not None:
        calls["FlashMLA"] = _flashmla_call(x)
    if importlib.util.find_spec("flashinfer") is not None:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        for backend in FLASHINFER_BACKENDS:
            calls[f"FlashInfer {backend}"] = _flashinfer_run(BatchMLAPagedAttentionWrapper, x, {"backend": backend})
    return calls


def _flashinfer_run(wrapper_class: type, x: DecodeInputs, options: dict[str, object]) -> Call:
    """`run(q_nope, q_pe, ckv, kpe, out=, lse=, return_lse=True)` of a wrapper planned once for the batch
    (FlashInfer's, or mlakit's drop-in of it), as an engine calls it every layer."""
    batch, q_len, heads, _ = x.q.shape
    device = x.q.device
    page_size = x.kv_cache.shape[1]
    pages_used = (x.cache_seqlens.long() + page_size - 1) // page_size
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = pages_used.cumsum(0)
    in_use = torch.arange(x.block_table.shape[1], device=device)[None, :] < pages_used[:, None]
    kv_indices = x.block_table[in_use].contiguous()
    qo_indptr = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=device)
    wrapper = wrapper_class(torch.empty(128 << 20, dtype=torch.uint8, device=device), **options)
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, x.cache_seqlens, heads, KV_LORA_RANK, DIM - KV_LORA_RANK, page_size,
                 True, x.softmax_scale, x.q.dtype, x.kv_cache.dtype)
    flat_q = x.q.reshape(batch * q_len, heads, DIM)
    q_nope, q_pe = flat_q[..., :KV_LORA_RANK], flat_q[..., KV_LORA_RANK:]
    ckv, kpe = x.kv_cache[..., :KV_LORA_RANK], x.kv_cache[..., KV_LORA_RANK:]
    out = torch.empty(batch * q_len, heads, KV_LORA_RANK, dtype=x.q.dtype, device=device)
    lse = torch.empty(batch * q_len, heads, dtype=torch.float32, device=device)
    return lambda: wrapper.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse, return_lse=True)


def _prefill_calls(case: OverheadCase, device: torch.device) -> dict[str, Call]:
    inputs = make_inputs(DecodeCase(case.heads, case.batch, case.seqlen), device)
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(case.batch * case.new, case.heads, NOPE_DIM + DIM - KV_LORA_RANK, generator=gen, device=device,
                    dtype=torch.bfloat16)
    weight = torch.randn(case.heads * (NOPE_DIM + V_DIM), KV_LORA_RANK, generator=gen, device=device,
                         dtype=torch.bfloat16) / KV_LORA_RANK**0.5
    meta = plan_prefill([case.new] * case.batch, [case.seqlen] * case.batch, inputs.block_table,
                        inputs.kv_cache.shape[1], heads=case.heads)
    scale = (NOPE_DIM + DIM - KV_LORA_RANK) ** -0.5
    out = torch.empty(q.shape[0], case.heads, V_DIM, dtype=q.dtype, device=device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=device)
    return {
        "mla_prefill": lambda: mla_prefill(q, inputs.kv_cache, weight, meta, softmax_scale=scale, backend="triton",
                                           check_inputs=False),
        "mla_prefill out=": lambda: mla_prefill(q, inputs.kv_cache, weight, meta, softmax_scale=scale,
                                                backend="triton", check_inputs=False, out=out, lse=lse),
    }


def run_cases(cases: list[OverheadCase], device: torch.device, log: Callable[[str], None],
              calls: int = CALLS, profile: str | None = None) -> list[dict[str, object]]:
    """One row per (case, call): host, eager and graph microseconds, eager over graph, and host over the
    FlashInfer fa3 call's host time in the same case where it ran. With `profile`, the calls whose
    name contains it also log their `host_profile`."""
    rows = []
    for case in cases:
        case_rows = []
        for name, call in case_calls(case, device).items():
            if profile is not None and profile in name:
                log(f"{case.label} {name}: host profile over {PROFILE_CALLS} calls\n{host_profile(call)}")
            try:
                cost = measure(call, calls)
            except Exception as exc:  # a peer that refuses this case is reported, not fatal
                log(f"{case.label:<28} {name:<30} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            row = {"case": case.label, **dataclasses.asdict(case), "call": name, **cost}
            row["eager_x_graph"] = cost["eager_us"] / cost["graph_us"] if cost["graph_us"] else None
            case_rows.append(row)
        fa3 = next((r["host_us"] for r in case_rows if r["call"] == "FlashInfer fa3"), None)
        for row in case_rows:
            row["host_x_fa3"] = row["host_us"] / fa3 if fa3 else None
            log(format_row(row))
        rows += case_rows
        torch.cuda.empty_cache()
    return rows


def host_profile(call: Call, calls: int = PROFILE_CALLS, rows: int = 20) -> str:
    """Where one eager call's host time goes: torch.profiler's CPU table (self time per op, Python
    functions included) over `calls` calls after two warm-ups, busiest first. The profiler's own
    cost inflates every row; read it for the ranking, `measure` for the time.

    >>> print(host_profile(lambda: torch.ones(4).sum(), calls=3, rows=2))  # doctest: +ELLIPSIS
    -...
    """
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def format_row(row: dict[str, object]) -> str:
    """One result line.

    >>> format_row({"case": "decode h16 1x1024 q1", "call": "mla_decode", "host_us": 20.0, "eager_us": 21.5,
    ...             "graph_us": 15.0, "eager_x_graph": 1.43, "host_x_fa3": 0.5})
    'decode h16 1x1024 q1         mla_decode                      host   20.0 us  eager   21.5 us  graph   15.0 us  eager/graph 1.43  host/fa3 0.50'
    """
    graph = f"{row['graph_us']:6.1f} us" if row["graph_us"] else "     - us"
    ratio = f"{row['eager_x_graph']:.2f}" if row["eager_x_graph"] else "-"
    fa3 = f"{row['host_x_fa3']:.2f}" if row["host_x_fa3"] else "-"
    return (f"{row['case']:<28} {row['call']:<30}  host {row['host_us']:6.1f} us  eager {row['eager_us']:6.1f} us  "
            f"graph {graph}  eager/graph {ratio}  host/fa3 {fa3}")
