"""`mlakit bench prefill`: the MHA-form prefill timed against the bf16 matmul ceiling.

Each case is timed in two parts, median of `triton.testing.do_bench` (L2 flushed before each
call) or, with `--sustained`, back to back once the power-capped clock has settled (`timing.sustained_ms`),
random N(0, 1) bf16 data, every candidate first checked against an fp32 reference of
sequence 0's last `CHECK_ROWS` queries:

- attention: `triton_mha_prefill` alone on pre-decompressed k_nope / k_pe / v, each sequence's
  prefix and new keys in ONE causal pass (bottom-right aligned), against torch SDPA on [B, H, S, D]
  copies (`causal_lower_right` mask, fused kernels only, so never the math path that materialises
  the scores) and FlashAttention's `flash_attn_varlen_func` when installed (v zero-padded to
  d_qk, as FA2 takes one head dim).
- full: `mla_prefill(..., backend="triton")` from the paged cache (gather, decompress GEMM,
  attention passes, lse merge), for the one-piece plan and the chunked plans; the metadata is
  built outside the timed call. A chunked plan equal to the one-piece one (the whole prefix
  within one chunk) is not timed again.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mlakit.attention.functional import mla_prefill
from mlakit.bench.ceilings import Ceilings
from mlakit.bench.decode import DecodeCase, DecodeInputs, make_inputs
from mlakit.bench.timing import median_ms
from mlakit.prefill.mha import attend_heads, decompress, gather_rows
from mlakit.prefill.metadata import DEFAULT_PREFIX_CHUNK_TOKENS, PrefillMetadata, plan_prefill

if TYPE_CHECKING:
    from mlakit.kernels.triton_prefill import PrefillTuning

KV_LORA_RANK, ROPE_DIM, NOPE_DIM, V_DIM = 512, 64, 128, 128
QK_DIM = NOPE_DIM + ROPE_DIM
SOFTMAX_SCALE = QK_DIM**-0.5
PAGE_SIZE = 64
CHECK_ROWS = 128
ONE_PIECE = "one_piece"
CHUNK_TOKENS = tuple(dict.fromkeys((DEFAULT_PREFIX_CHUNK_TOKENS, 4096)))
BASELINES = ("sdpa", "flash_attn")


@dataclasses.dataclass(frozen=True)
class PrefillCase:
    """`batch` sequences of `new_tokens` new tokens each after `prefix` cached tokens, `heads` heads."""

    heads: int
    batch: int
    new_tokens: int
    prefix: int

    @classmethod
    def parse(cls, spec: str) -> PrefillCase:
        """A case from `heads,batch,new_tokens,prefix`.

        >>> PrefillCase.parse("128,1,2048,32768").label
        'h128 b1 n2048 p32768'
        """
        fields = spec.split(",")
        if len(fields) != 4 or not all(f.strip().isdigit() for f in fields):
            raise ValueError(f"case {spec!r}: expected heads,batch,new_tokens,prefix (four integers)")
        return cls(*(int(f) for f in fields))

    @property
    def label(self) -> str:
        return f"h{self.heads} b{self.batch} n{self.new_tokens} p{self.prefix}"

    @property
    def seq_keys(self) -> int:
        """Keys of one sequence: its prefix and its new tokens."""
        return self.prefix + self.new_tokens

    @property
    def query_rows(self) -> int:
        return self.batch * self.new_tokens

    @property
    def key_rows(self) -> int:
        return self.batch * self.seq_keys

    @property
    def attention_flops(self) -> int:
        """2 x heads x (d_qk + d_v) x the (query, key) pairs a bottom-right causal mask lets through.

        >>> PrefillCase(heads=1, batch=1, new_tokens=2, prefix=1).attention_flops  # 2 * 320 * (2 + 3)
        3200
        """
        pairs = self.new_tokens * self.prefix + self.new_tokens * (self.new_tokens + 1) // 2
        return 2 * self.heads * (QK_DIM + V_DIM) * pairs * self.batch

    @property
    def decompress_flops(self) -> int:
        """The `kv_b_proj` GEMM of every key row (one-piece and chunked plans decompress each row once)."""
        return 2 * self.key_rows * KV_LORA_RANK * self.heads * (NOPE_DIM + V_DIM)


TARGET = PrefillCase(128, 1, 8192, 0)
CHUNKED_TARGET = PrefillCase(128, 1, 2048, 32768)
# Issue 22: a chunked prefix within this factor of the one-piece plan's time.
CHUNKED_TARGET_RATIO = 1.1


def default_cases(quick: bool) -> list[PrefillCase]:
    """The issue's grid (36 cases), or with `quick` the two 128-head targets plus spot checks.

    >>> len(default_cases(quick=False)), default_cases(quick=True)[:2] == [TARGET, CHUNKED_TARGET]
    (36, True)
    """
    if quick:
        return [TARGET, CHUNKED_TARGET, PrefillCase(128, 8, 512, 4096), PrefillCase(16, 1, 8192, 0), PrefillCase(16, 8, 2048, 32768)]
    return [
        PrefillCase(h, b, n, p) for h in (128, 16) for b in (1, 8) for n in (512, 2048, 8192) for p in (0, 4096, 32768)
    ]


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Estimated peak device bytes of the parts of a case, from its tensor sizes (the parts run one after the other)."""

    attention: int  # q, decompressed k_nope|v and k_pe, then the fp32 reference rows or one kernel's output
    with_baselines: int  # the same with SDPA's or FlashAttention's own q, k, v and output copies
    full: int  # cache, q, then the reference rows or the one-piece plan's gathered and decompressed rows, out, merge states

    @classmethod
    def of(cls, case: PrefillCase) -> Footprint:
        """Estimates for `case` (bf16 data, fp32 lse, merge and reference; page rounding ignored).

        >>> Footprint.of(PrefillCase(128, 8, 8192, 32768)).fits(80e9)
        True
        """
        h, t, k = case.heads, case.query_rows, case.key_rows
        q = t * h * QK_DIM * 2
        keys = k * (h * (NOPE_DIM + V_DIM) + ROPE_DIM) * 2
        out = t * h * (V_DIM * 2 + 4)
        reference = case.seq_keys * h * (2 * (QK_DIM + V_DIM) + 3 * CHECK_ROWS) * 4  # fp32 keys and values (twice), scores
        copies = h * (t + k) * 2 * QK_DIM * 2  # at most 2 x d_qk wide per query and key row
        cache = 2 * k * (KV_LORA_RANK + ROPE_DIM) * 2  # pages and gathered rows
        merge = 3 * t * h * V_DIM * 4
        return cls(
            attention=q + keys + max(reference, out),
            with_baselines=q + keys + out + copies,
            full=q + cache + max(reference, keys + out + merge),
        )

    @property
    def peak(self) -> int:
        return max(self.attention, self.full)

    def fits(self, budget: float) -> bool:
        return self.peak <= budget

    def baselines_fit(self, budget: float) -> bool:
        return self.with_baselines <= budget


@dataclasses.dataclass
class AttentionInputs:
    """Packed data of one case: q `[T, H, d_qk]`, k_nope and v `[Tk, H, 128]` (the halves of one
    tensor, as `decompress` returns them), k_pe `[Tk, 64]`, int32 segment offsets."""

    case: PrefillCase
    q: torch.Tensor
    k_nope: torch.Tensor
    k_pe: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor


def make_attention_inputs(case: PrefillCase, device: torch.device, seed: int = 0) -> AttentionInputs:
    """Random bf16 inputs of the attention part.

    >>> x = make_attention_inputs(PrefillCase(2, 3, 4, 5), torch.device("cpu"))
    >>> x.q.shape, x.v.shape, x.k_pe.shape, x.cu_seqlens_k.tolist()
    (torch.Size([12, 2, 192]), torch.Size([27, 2, 128]), torch.Size([27, 64]), [0, 9, 18, 27])
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    kv = torch.randn(case.key_rows, case.heads, NOPE_DIM + V_DIM, generator=gen, device=device, dtype=torch.bfloat16)
    q = torch.randn(case.query_rows, case.heads, QK_DIM, generator=gen, device=device, dtype=torch.bfloat16)
    k_pe = torch.randn(case.key_rows, ROPE_DIM, generator=gen, device=device, dtype=torch.bfloat16)
    segments = torch.arange(case.batch + 1, device=device, dtype=torch.int32)
    return AttentionInputs(
        case, q, kv[..., :NOPE_DIM], k_pe, kv[..., NOPE_DIM:], segments * case.new_tokens, segments * case.seq_keys
    )


Call = Callable[[], torch.Tensor]
# Builds a kernel's own inputs (outside the timed region) and returns the timed call; its output
# is packed `[T, H, d_v]`, or `[B, H, n, d_v]` for SDPA.
AttentionFactory = Callable[[AttentionInputs], Call]


def _triton_kernel(tuning: PrefillTuning | None) -> AttentionFactory:
    def prepare(x: AttentionInputs) -> Call:
        from mlakit.kernels.triton_prefill import triton_mha_prefill

        return lambda: triton_mha_prefill(
            x.q, x.k_nope, x.k_pe, x.v, x.cu_seqlens_q, x.cu_seqlens_k,
            max_q_len=x.case.new_tokens, causal=True, softmax_scale=SOFTMAX_SCALE, tuning=tuning,
        )[0]

    return prepare


def _fp8_kernel(quantize_in_call: bool) -> AttentionFactory:
    """`fp8_mha_prefill` on the inputs rounded to e4m3 (`quantize_prefill_operands`): outside the timed call (the
    kernel alone), or inside it (what a bf16 caller pays end to end)."""

    def prepare(x: AttentionInputs) -> Call:
        from mlakit.prefill.fp8 import fp8_mha_prefill, quantize_prefill_operands

        def attend(operands) -> torch.Tensor:
            return fp8_mha_prefill(operands, x.cu_seqlens_q, max_q_len=x.case.new_tokens, max_k_len=x.case.seq_keys,
                                   causal=True, softmax_scale=SOFTMAX_SCALE)[0]

        if quantize_in_call:
            return lambda: attend(quantize_prefill_operands(x.q, x.k_nope, x.k_pe, x.v, x.cu_seqlens_k))
        operands = quantize_prefill_operands(x.q, x.k_nope, x.k_pe, x.v, x.cu_seqlens_k)
        return lambda: attend(operands)

    return prepare


def _sdpa(x: AttentionInputs) -> Call:
    """SDPA on contiguous [B, H, S, D] copies, k = cat(k_nope, k_pe broadcast over heads)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    c = x.case

    def bhsd(t: torch.Tensor, seq: int) -> torch.Tensor:
        return t.reshape(c.batch, seq, -1, t.shape[-1]).transpose(1, 2)

    q = bhsd(x.q, c.new_tokens).contiguous()
    v = bhsd(x.v, c.seq_keys).contiguous()
    k = torch.empty(c.batch, c.heads, c.seq_keys, QK_DIM, dtype=q.dtype, device=q.device)
    k[..., :NOPE_DIM] = bhsd(x.k_nope, c.seq_keys)
    k[..., NOPE_DIM:] = bhsd(x.k_pe, c.seq_keys)
    mask = causal_lower_right(c.new_tokens, c.seq_keys)  # SDPA runs it as is_causal when there is no prefix
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]

    def call() -> torch.Tensor:
        with sdpa_kernel(fused):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=SOFTMAX_SCALE)

    return call


def _flash_attn(x: AttentionInputs) -> Call:
    from flash_attn import flash_attn_varlen_func

    k = torch.cat([x.k_nope, x.k_pe[:, None].expand(-1, x.case.heads, -1)], dim=-1)
    v = torch.nn.functional.pad(x.v, (0, QK_DIM - V_DIM))
    return lambda: flash_attn_varlen_func(
        x.q, k, v, x.cu_seqlens_q, x.cu_seqlens_k, x.case.new_tokens, x.case.seq_keys,
        softmax_scale=SOFTMAX_SCALE, causal=True,
    )[..., :V_DIM]


def attention_kernels(tunings: dict[str, PrefillTuning], fp8: bool = False) -> dict[str, AttentionFactory]:
    """Our kernel (default tiles, then each named tuning), SDPA, FlashAttention when installed, and with `fp8` our
    e4m3 kernel (SM90): "triton_fp8" on operands rounded beforehand, "triton_fp8_e2e" rounding them in the call.

    >>> list(attention_kernels({}))[:2], list(attention_kernels({}, fp8=True))[-2:]
    (['triton', 'sdpa'], ['triton_fp8', 'triton_fp8_e2e'])
    """
    kernels = {"triton": _triton_kernel(None), **{name: _triton_kernel(t) for name, t in tunings.items()}, "sdpa": _sdpa}
    if importlib.util.find_spec("flash_attn") is not None:
        kernels["flash_attn"] = _flash_attn
    if fp8:
        kernels |= {"triton_fp8": _fp8_kernel(quantize_in_call=False), "triton_fp8_e2e": _fp8_kernel(quantize_in_call=True)}
    return kernels


def parse_tuning(spec: str) -> tuple[str, PrefillTuning]:
    """`NAME=block_m,block_n,warps,stages[,kernel]` as a named PrefillTuning (needs triton; kernel
    "portable" by default, "hopper" or "hopper_persistent").

    >>> parse_tuning("wide=128,128,8,3")
    ('wide', PrefillTuning(block_m=128, block_n=128, num_warps=8, num_stages=3, kernel='portable'))
    >>> parse_tuning("h64=128,64,4,3,hopper")[1].kernel
    'hopper'
    >>> parse_tuning("persist=128,128,4,2,hopper_persistent")[1].kernel
    'hopper_persistent'
    """
    from mlakit.kernels.triton_prefill import PrefillTuning

    name, _, fields = spec.partition("=")
    values = fields.split(",")
    numbers, kernel = (values[:4], values[4:] or ["portable"])
    if not name or len(values) not in (4, 5) or not all(v.strip().isdigit() for v in numbers):
        raise ValueError(f"tuning {spec!r}: expected NAME=block_m,block_n,warps,stages[,kernel]")
    return name, PrefillTuning(*(int(v) for v in numbers), kernel=kernel[0].strip())


def full_plans(case: PrefillCase) -> dict[str, int]:
    """`prefix_chunk_tokens` of each end-to-end plan: one piece (the whole prefix in one chunk), then the chunked ones.

    >>> full_plans(PrefillCase(128, 2, 512, 4096))
    {'one_piece': 8192, 'chunk_8192': 8192, 'chunk_4096': 4096}
    """
    return {ONE_PIECE: max(1, case.batch * case.prefix), **{f"chunk_{n}": n for n in CHUNK_TOKENS}}


@dataclasses.dataclass
class PrefillResult:
    """One timed candidate of one case. `flops` of a full prefill add the decompress GEMM to the attention's."""

    case: PrefillCase
    part: str  # "attention" or "full"
    kernel: str  # attention: triton, tuning names, sdpa, flash_attn; full: one_piece, chunk_<tokens>
    time_ms: float
    flops: int
    matmul_ratio: float  # TFLOP/s over the bf16 matmul ceiling of the same run
    rel_error: float  # vs the fp32 reference rows
    x_one_piece: float | None = None  # chunked plans: time over the one-piece plan's

    @property
    def tflop_per_s(self) -> float:
        return self.flops / self.time_ms / 1e9

    def to_json(self) -> dict[str, object]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "case"}
        return {"case": self.case.label, **dataclasses.asdict(self.case), **fields, "tflop_per_s": self.tflop_per_s}

    def line(self) -> str:
        ratio = f"  {self.x_one_piece:.2f}x one-piece" if self.x_one_piece is not None else ""
        return (
            f"{self.case.label:<22} {self.part:<9} {self.kernel:<12} {self.time_ms:9.3f} ms {self.tflop_per_s:6.0f} TFLOP/s "
            f"{self.matmul_ratio * 100:5.1f}% matmul  err {self.rel_error:.1e}{ratio}"
        )


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A case, or one candidate of it, left out: over the memory budget, or failed."""

    case: PrefillCase
    kernel: str  # "all" when the whole case was skipped
    reason: str

    def to_json(self) -> dict[str, object]:
        return {"case": self.case.label, "kernel": self.kernel, "reason": self.reason}


@dataclasses.dataclass
class Run:
    """Results and skips of one benchmark run, logged as they come."""

    ceilings: Ceilings
    log: Callable[[str], None]
    time_ms: Callable[[Call], float] = median_ms  # or `timing.sustained_ms`
    results: list[PrefillResult] = dataclasses.field(default_factory=list)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)

    def skip(self, case: PrefillCase, kernel: str, reason: str) -> None:
        self.skipped.append(Skipped(case, kernel, reason))
        self.log(f"{case.label:<22} {kernel:<22} skipped: {reason}")

    def measure(
        self,
        case: PrefillCase,
        part: str,
        kernel: str,
        prepare: Callable[[], Call],
        check: Callable[[torch.Tensor], float],
        flops: int,
        relative_to: PrefillResult | None = None,
    ) -> PrefillResult | None:
        """Prepares the call, checks its output, times it; a failure (out of memory or shared memory,
        a layout no fused SDPA kernel takes) is logged and skipped."""
        try:
            call = prepare()
            error = check(call())
            time_ms = self.time_ms(call)
        except Exception as exc:
            self.skip(case, kernel, f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
            torch.cuda.empty_cache()
            return None
        result = PrefillResult(
            case, part, kernel, time_ms, flops, flops / time_ms / 1e9 / self.ceilings.matmul_tflop_per_s, error,
            time_ms / relative_to.time_ms if relative_to is not None else None,
        )
        self.results.append(result)
        self.log(result.line())
        return result


def _reference_rows(case: PrefillCase, q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32 output `[rows, H, d_v]` of sequence 0's last CHECK_ROWS queries over its keys (bottom-right causal)."""
    n, s = case.new_tokens, case.seq_keys
    rows = min(CHECK_ROWS, n)
    k = torch.cat([k_nope[:s], k_pe[:s, None].expand(-1, case.heads, -1)], dim=-1).float()
    out, _ = attend_heads(q[n - rows : n].float(), k, v[:s].float(), SOFTMAX_SCALE, causal=True)
    return out


def _check_rows(out: torch.Tensor, case: PrefillCase, expected: torch.Tensor) -> float:
    """Relative error of sequence 0's last rows of `out` (packed, or SDPA's [B, H, n, d_v])."""
    if out.dim() == 4:
        out = out.transpose(1, 2).reshape(case.query_rows, case.heads, V_DIM)
    got = out[case.new_tokens - expected.shape[0] : case.new_tokens].float()
    return float((got - expected).norm() / expected.norm())


def _run_attention(run: Run, case: PrefillCase, kernels: dict[str, AttentionFactory], device: torch.device, baselines: bool) -> None:
    """Every attention kernel on the same inputs; the baselines only when `baselines` (their copies fit)."""
    x = make_attention_inputs(case, device)
    check = functools.partial(_check_rows, case=case, expected=_reference_rows(case, x.q, x.k_nope, x.k_pe, x.v))
    for name, prepare in kernels.items():
        if name in BASELINES and not baselines:
            run.skip(case, name, "its own [B, H, S, D] copies would not fit the memory budget")
        else:
            run.measure(case, "attention", name, functools.partial(prepare, x), check, case.attention_flops)


@dataclasses.dataclass(frozen=True)
class FullInputs:
    """`mla_prefill`'s inputs for a case, as the full part times it: a cache of shuffled pages with its block table
    (`bench.decode.make_inputs`), seeded random queries and `kv_b_proj` weight."""

    case: PrefillCase
    paged: DecodeInputs
    q: torch.Tensor
    weight: torch.Tensor

    @classmethod
    def make(cls, case: PrefillCase, device: torch.device) -> FullInputs:
        paged = make_inputs(DecodeCase(case.heads, case.batch, case.seq_keys, page_size=PAGE_SIZE), device)
        gen = torch.Generator(device=device).manual_seed(1)
        q = torch.randn(case.query_rows, case.heads, QK_DIM, generator=gen, device=device, dtype=torch.bfloat16)
        weight = torch.randn(case.heads * (NOPE_DIM + V_DIM), KV_LORA_RANK, generator=gen, device=device,
                             dtype=torch.bfloat16)
        return cls(case, paged, q, weight * KV_LORA_RANK**-0.5)

    def plan(self, prefix_chunk_tokens: int) -> PrefillMetadata:
        """The metadata of the plan cutting the prefixes into chunks of `prefix_chunk_tokens`."""
        case = self.case
        return plan_prefill([case.new_tokens] * case.batch, [case.seq_keys] * case.batch, self.paged.block_table,
                            PAGE_SIZE, prefix_chunk_tokens=prefix_chunk_tokens, heads=case.heads)


def _prefill_call(q: torch.Tensor, cache: torch.Tensor, weight: torch.Tensor, meta: PrefillMetadata) -> Call:
    return lambda: mla_prefill(q, cache, weight, meta, softmax_scale=SOFTMAX_SCALE, backend="triton", check_inputs=False)[0]


def _run_full(run: Run, case: PrefillCase, device: torch.device) -> None:
    """`mla_prefill` on a cache of shuffled pages, checked against sequence 0 gathered and decompressed in fp32."""
    inputs = FullInputs.make(case, device)
    paged, q, weight = inputs.paged, inputs.q, inputs.weight
    positions = torch.arange(case.seq_keys, device=device)
    slots = paged.block_table[0, positions // PAGE_SIZE].long() * PAGE_SIZE + positions % PAGE_SIZE
    keys = decompress(gather_rows(paged.kv_cache, None, slots, torch.float32), weight.float(), case.heads, NOPE_DIM)
    check = functools.partial(_check_rows, case=case, expected=_reference_rows(case, q, *keys))
    del keys
    one_piece = None
    for name, chunk in full_plans(case).items():
        meta = inputs.plan(chunk)
        if name != ONE_PIECE and not meta.prefix_chunks:
            continue  # the whole prefix fits one chunk: the one-piece plan again
        prepare = functools.partial(_prefill_call, q, paged.kv_cache, weight, meta)
        result = run.measure(case, "full", name, prepare, check, case.attention_flops + case.decompress_flops, one_piece)
        if name == ONE_PIECE:
            one_piece = result


def run_cases(
    cases: list[PrefillCase], tunings: dict[str, PrefillTuning], device: torch.device, ceilings: Ceilings, budget: float,
    log: Callable[[str], None], time_ms: Callable[[Call], float] = median_ms, fp8: bool = False,
) -> Run:
    """Both parts of every case whose footprint fits `budget` bytes (the baselines only where their copies fit too),
    each call timed by `time_ms`; with `fp8` the e4m3 attention kernel too (`attention_kernels`)."""
    run = Run(ceilings, log, time_ms)
    kernels = attention_kernels(tunings, fp8)
    for case in cases:
        footprint = Footprint.of(case)
        if not footprint.fits(budget):
            run.skip(case, "all", f"needs ~{footprint.peak / 1e9:.0f} GB, over the {budget / 1e9:.0f} GB budget")
            continue
        _run_attention(run, case, kernels, device, footprint.baselines_fit(budget))
        torch.cuda.empty_cache()
        _run_full(run, case, device)
        torch.cuda.empty_cache()
    return run


def summary(results: list[PrefillResult]) -> list[str]:
    """The issue's targets: attention on the target case, chunked over one-piece at a 32768-token prefix (<= 1.1x).

    >>> summary([PrefillResult(CHUNKED_TARGET, "full", "chunk_8192", 2.4, 10**12, 0.5, 1e-3, x_one_piece=1.2)])
    ['chunked h128 b1 n2048 p32768: chunk_8192 1.20x one-piece (target <= 1.1x)']
    """
    lines = [
        f"target {r.case.label}: {r.kernel} at {r.matmul_ratio * 100:.0f}% of the matmul ceiling"
        for r in results if r.case == TARGET and r.part == "attention"
    ]
    lines += [
        f"chunked {r.case.label}: {r.kernel} {r.x_one_piece:.2f}x one-piece (target <= {CHUNKED_TARGET_RATIO}x)"
        for r in results if r.case.prefix == 32768 and r.x_one_piece is not None
    ]
    return lines


def write_results(path: Path, env: dict[str, object], run: Run, budget: float) -> None:
    """`{"environment": env and the memory budget, "results": [one per timed candidate], "skipped": [...]}`."""
    data = {
        "environment": {**env, "memory_budget_bytes": int(budget)},
        "results": [r.to_json() for r in run.results],
        "skipped": [s.to_json() for s in run.skipped],
    }
    path.write_text(json.dumps(data, indent=1))


def plot_results(path: Path, results: list[PrefillResult]) -> None:
    """Attention TFLOP/s over the matmul ceiling per case, one bar per kernel (Triton vs SDPA and the rest)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r.part == "attention"]
    cases = list(dict.fromkeys(r.case.label for r in rows))
    kernels = list(dict.fromkeys(r.kernel for r in rows))
    width = 0.8 / max(1, len(kernels))
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.45), 5))
    for k, kernel in enumerate(kernels):
        by_case = {r.case.label: r.matmul_ratio for r in rows if r.kernel == kernel}
        ax.bar([i + k * width for i in range(len(cases))], [by_case.get(c, 0) for c in cases], width, label=kernel)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=75, fontsize=7)
    ax.set_ylabel("attention TFLOP/s / bf16 matmul ceiling (higher is better)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
