"""Triton MHA-form attention for MLA prefill: variable-length segments, head dim
d_nope + d_rope for scores and d_v for values, the rope key shared by all heads.

One program owns BLOCK_M query tokens of one head of one segment and walks that
segment's keys in BLOCK_N tiles (flash attention, online softmax in base 2). Scores
are two dots, `q_nope . k_nope` (per head) and `q_pe . k_pe` (one k_pe row per key,
read by every head), so neither the 192-wide key nor the shared rope part is ever
materialised per head. Key tiles every row of the block fully sees run without a mask;
only the diagonal tiles (causal) and the last partial tile pay for one.

Causal alignment is bottom-right, as in the reference: in a segment of n queries and
m keys, query i sees keys 0 .. i + m - n (the new tokens are the last n keys).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from mlakit.attention.checks import checked_softmax_scale
from mlakit.errors import MLAInputError
from mlakit.kernels.interpreter import INTERPRET
from mlakit.kernels.launch import CachedLaunch

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


KERNELS = ("portable", "hopper", "hopper_persistent")
# The Gluon kernels of `hopper_prefill`: "hopper_persistent" is its persistent form (one program per SM).
HOPPER_KERNELS = ("hopper", "hopper_persistent")
# Stages of each of their K and V rings: at least 2 (a warpgroup releases a tile once it holds the next), at most
# HOPPER_MAX_STAGES (a named barrier a stage).
HOPPER_MAX_STAGES = 3


@dataclasses.dataclass(frozen=True)
class PrefillTuning:
    """Tile sizes and launch settings of the prefill kernel: `kernel` "portable" (this module's
    Triton kernel) or "hopper" (`hopper_prefill`'s Gluon kernel, SM90 only: 128 query rows a
    program on 4 + 4 + 1 warps, so block_m 128 and num_warps 4; block_n 64 or 128 keys a tile and
    num_stages 2 or 3 stages in each of its K and V rings, within 227 KiB of shared memory), or
    "hopper_persistent" (its persistent form, same settings)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    kernel: str = "portable"

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise MLAInputError(f"PrefillTuning.{name}: expected a power of two >= 16, got {value}")
        if self.kernel not in KERNELS:
            raise MLAInputError(f"PrefillTuning.kernel: expected one of {KERNELS}, got {self.kernel!r}")
        if self.num_stages < 1:
            raise MLAInputError(f"PrefillTuning.num_stages: expected >= 1, got {self.num_stages}")
        if self.kernel in HOPPER_KERNELS and ((self.block_m, self.num_warps) != (128, 4)
                                              or not 2 <= self.num_stages <= HOPPER_MAX_STAGES
                                              or self.block_n not in (64, 128)):
            raise MLAInputError(f"PrefillTuning: the {self.kernel} kernel runs block_m 128 on num_warps 4 with block_n 64 or 128 "
                                f"and 2 <= num_stages <= {HOPPER_MAX_STAGES}, got {self}")


# The SM90 default: the persistent Hopper kernel, 128-key tiles, K and V rings of 2 stages each (10-16% faster
# than 64-key tiles in one 3-stage ring at 8192 tokens and with long prefixes: NOTES.md, p11).
HOPPER_TUNING = PrefillTuning(block_m=128, block_n=128, num_warps=4, num_stages=2, kernel="hopper_persistent")
# Causal passes of at most SHORT_PROMPT_TOKENS keys a segment take 64-key tiles in 3-stage rings instead, where two
# Q buffers fit (6% faster at 256 tokens, 7-8% at 512; since p19 128-key tiles are 5-10% faster at 1024 tokens and
# 15% with a 4096-token prefix: NOTES.md, p15, p19).
SHORT_HOPPER_TUNING = PrefillTuning(block_m=128, block_n=64, num_warps=4, num_stages=3, kernel="hopper_persistent")
SHORT_PROMPT_TOKENS = 512


@functools.cache
def default_prefill_tuning(device: torch.device) -> PrefillTuning:
    """Tiles for `device`: on Hopper and datacenter Blackwell 128x64 tiles, 8 warps, 3 stages (best of
    7 tried on an H100, benchmarks/NOTES.md; they need 168 KiB of shared memory); fewer stages
    on the A100 (164 KiB) and small tiles where a block gets ~100 KiB (other SM8x, SM12x; not
    measured here); small tiles under the interpreter."""
    if device.type != "cuda":
        return PrefillTuning(block_m=16, block_n=16, num_warps=1, num_stages=1)
    major, minor = torch.cuda.get_device_capability(device)
    if major in (9, 10):
        return PrefillTuning(block_m=128, block_n=64, num_warps=8, num_stages=3)
    if (major, minor) == (8, 0):
        return PrefillTuning(block_m=128, block_n=64, num_warps=8, num_stages=2)
    return PrefillTuning(block_m=64, block_n=32, num_warps=4, num_stages=2)


@triton.jit
def _attend_key_range(
    acc, m_i, l_i, q_nope, q_pe,
    K_NOPE, K_PE, V, key_base, stride_kn_tok, stride_kp_tok, stride_v_tok,
    k_len, lo, hi, rows_seen_limit,
    cols_n, cols_r, cols_v, n_ok, r_ok, v_ok, scale_log2,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):
    for key0 in range(lo, hi, BLOCK_N):
        keys = key0 + tl.arange(0, BLOCK_N)
        key_rows = (key_base + keys).to(tl.int64)
        if MASKED:
            key_ok = keys < k_len
            k_nope = tl.load(K_NOPE + key_rows[None, :] * stride_kn_tok + cols_n[:, None],
                             mask=key_ok[None, :] & n_ok[:, None], other=0.0)
            k_pe = tl.load(K_PE + key_rows[None, :] * stride_kp_tok + cols_r[:, None],
                           mask=key_ok[None, :] & r_ok[:, None], other=0.0)
            v = tl.load(V + key_rows[:, None] * stride_v_tok + cols_v[None, :],
                        mask=key_ok[:, None] & v_ok[None, :], other=0.0)
        else:
            k_nope = tl.load(K_NOPE + key_rows[None, :] * stride_kn_tok + cols_n[:, None], mask=n_ok[:, None], other=0.0)
            k_pe = tl.load(K_PE + key_rows[None, :] * stride_kp_tok + cols_r[:, None], mask=r_ok[:, None], other=0.0)
            v = tl.load(V + key_rows[:, None] * stride_v_tok + cols_v[None, :], mask=v_ok[None, :], other=0.0)
        if INTERPRET:
            k_nope = k_nope.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
            v = v.to(tl.float32)
        scores = (tl.dot(q_nope, k_nope) + tl.dot(q_pe, k_pe)) * scale_log2
        if MASKED:
            seen = key_ok[None, :]
            if CAUSAL:
                seen = seen & (keys[None, :] <= rows_seen_limit[:, None])
            scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def program_segment(CU_SEQLENS_Q, CU_SEQLENS_K):
    """A prefill program's row block (the grid's first axis reversed: heaviest blocks first), head and
    segment's query and key ranges; also called from the Gluon kernel (`hopper_prefill`)."""
    seq = tl.program_id(2)
    q_start = tl.load(CU_SEQLENS_Q + seq)
    k_start = tl.load(CU_SEQLENS_K + seq)
    return (tl.num_programs(0) - 1 - tl.program_id(0), tl.program_id(1), q_start,
            tl.load(CU_SEQLENS_Q + seq + 1) - q_start, k_start, tl.load(CU_SEQLENS_K + seq + 1) - k_start)


@triton.jit
def merged_with_earlier(earlier_out, earlier_lse, out, lse):
    """Rows' float32 out `[rows, d_v]` and natural-log lse `[rows]` merged with an earlier result over
    a disjoint key set (-inf lse: no keys there); also called from the Gluon kernel (`hopper_prefill`)."""
    top = tl.maximum(earlier_lse, lse)
    top = tl.where(top == float("-inf"), 0.0, top)
    w_earlier = tl.exp(earlier_lse - top)
    w_now = tl.exp(lse - top)
    total = w_earlier + w_now
    safe_total = tl.where(total > 0, total, 1.0)
    merged = (earlier_out * w_earlier[:, None] + out * w_now[:, None]) / safe_total[:, None]
    return merged, tl.where(total > 0, top + tl.log(safe_total), float("-inf"))


@triton.jit
def _mha_prefill_kernel(
    Q, K_NOPE, K_PE, V, OUT, LSE, CU_SEQLENS_Q, CU_SEQLENS_K,
    scale_log2,
    stride_q_tok, stride_q_head,
    stride_kn_tok, stride_kn_head,
    stride_kp_tok,
    stride_v_tok, stride_v_head,
    stride_o_tok, stride_o_head,
    stride_lse_tok,
    NOPE_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, V_DIM: tl.constexpr,
    BLOCK_NOPE: tl.constexpr, BLOCK_ROPE: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MERGE: tl.constexpr,
):
    block, head, q_start, q_len, k_start, k_len = program_segment(CU_SEQLENS_Q, CU_SEQLENS_K)
    m0 = block * BLOCK_M
    if m0 >= q_len or (MERGE and k_len == 0):
        return

    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    cols_n = tl.arange(0, BLOCK_NOPE)
    cols_r = tl.arange(0, BLOCK_ROPE)
    cols_v = tl.arange(0, BLOCK_V)
    n_ok = cols_n < NOPE_DIM
    r_ok = cols_r < ROPE_DIM
    v_ok = cols_v < V_DIM
    q_rows = Q + (q_start + rows)[:, None].to(tl.int64) * stride_q_tok + head * stride_q_head
    q_nope = tl.load(q_rows + cols_n[None, :], mask=row_ok[:, None] & n_ok[None, :], other=0.0)
    q_pe = tl.load(q_rows + NOPE_DIM + cols_r[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
    if INTERPRET:
        q_nope = q_nope.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    offset = k_len - q_len
    rows_seen_limit = rows + offset
    if CAUSAL:
        hi = tl.minimum(k_len, m0 + BLOCK_M + offset)
        unmasked_hi = tl.minimum(hi, m0 + offset + 1)
    else:
        hi = k_len
        unmasked_hi = k_len
    unmasked_hi = tl.maximum(unmasked_hi, 0) // BLOCK_N * BLOCK_N
    hi = tl.maximum(hi, 0)

    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    kn_base = K_NOPE + head * stride_kn_head
    v_base = V + head * stride_v_head
    acc, m_i, l_i = _attend_key_range(
        acc, m_i, l_i, q_nope, q_pe, kn_base, K_PE, v_base, k_start, stride_kn_tok, stride_kp_tok, stride_v_tok,
        k_len, 0, unmasked_hi, rows_seen_limit, cols_n, cols_r, cols_v, n_ok, r_ok, v_ok, scale_log2,
        BLOCK_N, False, CAUSAL,
    )
    acc, m_i, l_i = _attend_key_range(
        acc, m_i, l_i, q_nope, q_pe, kn_base, K_PE, v_base, k_start, stride_kn_tok, stride_kp_tok, stride_v_tok,
        k_len, unmasked_hi, hi, rows_seen_limit, cols_n, cols_r, cols_v, n_ok, r_ok, v_ok, scale_log2,
        BLOCK_N, True, CAUSAL,
    )

    has_keys = l_i > 0
    safe_l = tl.where(has_keys, l_i, 1.0)
    out = tl.where(has_keys[:, None], acc / safe_l[:, None], 0.0)
    lse = tl.where(has_keys, (m_i + tl.log2(safe_l)) * LN2, float("-inf"))
    out_ptrs = OUT + (q_start + rows)[:, None].to(tl.int64) * stride_o_tok + head * stride_o_head + cols_v[None, :]
    out_mask = row_ok[:, None] & v_ok[None, :]
    lse_ptrs = LSE + (q_start + rows).to(tl.int64) * stride_lse_tok + head
    if MERGE:
        earlier_lse = tl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        earlier_out = tl.load(out_ptrs, mask=out_mask, other=0.0).to(tl.float32)
        out, lse = merged_with_earlier(earlier_out, earlier_lse, out, lse)
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=out_mask)
    tl.store(lse_ptrs, lse, mask=row_ok)


def triton_mha_prefill(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_q_len: int,
    causal: bool,
    softmax_scale: float,
    tuning: PrefillTuning | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    merge: bool = False,
    max_k_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention of packed queries `q [T, H, d_nope + d_rope]` over keys `k_nope [Tk, H, d_nope]`
    with the shared rope key `k_pe [Tk, d_rope]` and values `v [Tk, H, d_v]`.

    Segment b is `q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]` over keys `cu_seqlens_k[b]:cu_seqlens_k[b+1]`
    (int32 offsets on the device; `max_q_len`, the longest query segment, sizes the grid; `max_k_len`, the
    longest key segment where the caller knows it, picks the tiles: `plan_attention`).
    Returns out `[T, H, d_v]` (q's dtype, or written into `out`) and lse `[T, H]` float32
    (natural log, or written into `lse`); a query without keys gets zeros and -inf. With
    `merge=True` the result is merged by lse into the earlier `out` / `lse` of a disjoint key
    set (a segment without keys leaves its rows untouched): that is how prefix chunks add up
    without a separate merge pass. Inputs may be strided views (last dim contiguous), e.g.
    k_nope and v as the two halves of one decompressed `[Tk, H, d_nope + d_v]` tensor. Shapes
    and dtypes are the caller's contract (`mlakit.mla_prefill` checks them); softmax_scale must be a
    finite number > 0 (checked: the Hopper kernels take the row max before scaling).

    >>> dev = "cuda" if torch.cuda.is_available() else "cpu"
    >>> q, kn, kp, v = (torch.randn(s, device=dev) for s in ((5, 2, 24), (5, 2, 16), (5, 8), (5, 2, 16)))
    >>> cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=dev)
    >>> out, lse = triton_mha_prefill(q, kn, kp, v, cu, cu, max_q_len=3, causal=True, softmax_scale=0.2)
    >>> out.shape, lse.shape
    (torch.Size([5, 2, 16]), torch.Size([5, 2]))
    """
    softmax_scale = checked_softmax_scale(softmax_scale)
    tokens, heads, qk_dim = q.shape
    nope_dim, rope_dim, v_dim = k_nope.shape[-1], k_pe.shape[-1], v.shape[-1]
    if qk_dim != nope_dim + rope_dim:
        raise MLAInputError(f"q: expected last dim d_nope + d_rope = {nope_dim + rope_dim}, got {qk_dim}")
    for name, tensor in (("q", q), ("k_nope", k_nope), ("k_pe", k_pe), ("v", v)):
        if tensor.stride(-1) != 1:
            raise MLAInputError(f"{name}: expected a contiguous last dim, got strides {tensor.stride()}")
    out, lse, no_keys = attention_outputs(out, lse, (tokens, heads, v_dim), q.dtype, q.device, merge,
                                          cu_seqlens_q.shape[0] == 1 or max_q_len == 0 or k_nope.shape[0] == 0)
    if no_keys:
        return out, lse
    operands = (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, out, lse)
    plan = _planned(operands, max_q_len=max_q_len, causal=causal, merge=merge, tuning=tuning, max_k_len=max_k_len)
    plan(*operands, softmax_scale * LOG2E)
    return out, lse


# `triton_mha_prefill`'s launches by what planning one reads of its operands (`_plan_key`), so that calls of one
# layout (a model's layers in one step) plan once; at most MAX_PLANS kept (then forgotten all at once).
MAX_PLANS = 256
_PLANS: dict[tuple, AttentionLaunch] = {}


def _planned(operands: tuple[torch.Tensor, ...], *, max_q_len: int, causal: bool, merge: bool,
             tuning: PrefillTuning | None, max_k_len: int | None) -> AttentionLaunch:
    """`plan_attention`'s launch for `operands` (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, out, lse), kept by
    layout and stream: a persistent launch's unit counter must never be shared by launches that may overlap, so one
    kept launch serves one stream, and a launch captured into a CUDA graph (replayable on any stream) gets its own."""
    settings = dict(max_q_len=max_q_len, causal=causal, merge=merge, tuning=tuning, max_k_len=max_k_len)
    if operands[0].is_cuda and torch.cuda.is_current_stream_capturing():
        return plan_attention(*operands, **settings)
    key = _plan_key(operands, *settings.values())
    launch = _PLANS.get(key)
    if launch is None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        launch = _PLANS[key] = plan_attention(*operands, **settings)
    return launch


def _plan_key(operands: tuple[torch.Tensor, ...], *settings: object) -> tuple:
    """Everything `plan_attention` reads of its operands (dtypes, shapes, strides, 16-byte alignment, the device and,
    on a GPU, the current stream) and its settings.

    >>> x = torch.zeros(4, 2, 8)
    >>> _plan_key((x, x[:, :, :4]), 4, True) == _plan_key((x.clone(), x[:, :, 4:]), 4, True)
    True
    """
    q = operands[0]
    stream = driver.active.get_current_stream(q.device.index) if q.is_cuda else None  # torch's Stream object: 5 us
    layouts = tuple((t.dtype, t.shape, t.stride(), t.data_ptr() % 16) for t in operands)
    return (q.device, stream, layouts, *settings)


def attention_outputs(out: torch.Tensor | None, lse: torch.Tensor | None, shape: tuple[int, int, int],
                      dtype: torch.dtype, device: torch.device, merge: bool,
                      no_keys: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """An attention pass's out `shape` (made in `dtype` where not given) and lse, checked, and whether no query
    sees a key (`no_keys`, or no query rows): then out holds zeros and lse -inf, unless the pass merges.

    >>> out, lse, empty = attention_outputs(None, None, (0, 2, 4), torch.float32, torch.device("cpu"), False, False)
    >>> out.shape, lse.shape, empty
    (torch.Size([0, 2, 4]), torch.Size([0, 2]), True)
    """
    tokens, heads, _ = shape
    if merge and (out is None or lse is None):
        raise MLAInputError("out and lse: merge=True needs the earlier result to merge into")
    if out is not None and (out.shape != shape or out.stride(-1) != 1):
        raise MLAInputError(f"out: expected shape {shape} with a contiguous last dim, got {tuple(out.shape)}")
    if lse is not None and (lse.shape != (tokens, heads) or lse.dtype != torch.float32 or lse.stride(1) != 1):
        raise MLAInputError(f"lse: expected float32 {(tokens, heads)} with contiguous heads, got {lse.dtype} {tuple(lse.shape)}")
    out = torch.empty(shape, dtype=dtype, device=device) if out is None else out
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=device) if lse is None else lse
    no_keys = no_keys or tokens == 0
    if no_keys and not merge:
        out.zero_()
        lse.fill_(float("-inf"))
    return out, lse, no_keys


AttentionLaunch = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class PortableLaunch:
    """The portable kernel's launch for one attention pass's operand layout: key, grid, strides and
    constexprs. Calling it with `(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, out, lse, scale_log2)`
    launches the pass on tensors of that layout (`HopperPrefillLaunch` likewise for the Hopper kernel)."""

    key: tuple
    grid: tuple[int, int, int]
    strides: tuple[int, ...]
    constants: Mapping[str, object]

    def __call__(self, q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 scale_log2: float) -> None:
        _PREFILL(self.key, self.grid, (q, k_nope, k_pe, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale_log2, *self.strides),
                 self.constants)


def plan_attention(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
                   max_q_len: int, causal: bool, merge: bool, tuning: PrefillTuning | None = None,
                   max_k_len: int | None = None) -> AttentionLaunch:
    """The launch of one `triton_mha_prefill` pass for operands of these ones' layout (shapes, strides,
    dtypes, pointer alignment; the addresses may change between calls): the Hopper kernel's where
    it takes them, else the portable one's (`_tuning_for`). A causal pass whose segments have at most
    SHORT_PROMPT_TOKENS keys takes the short tiles; without a `tuning`, a pass of few units takes the
    one-program-per-row-block Hopper kernel (`_one_unit_per_program`). Without `max_k_len` the longest key segment is taken as
    `max_q_len` where there are no more key rows than query rows (in `mla_prefill`'s causal passes every segment has at
    least as many keys as queries, so then exactly as many), else as all the key rows; it picks tiles only, never
    the result."""
    if max_k_len is None:
        max_k_len = max_q_len if k_nope.shape[0] <= q.shape[0] else k_nope.shape[0]
    short = causal and max(max_q_len, max_k_len) <= SHORT_PROMPT_TOKENS
    chosen = tuning
    tuning = _tuning_for(tuning, q, k_nope, k_pe, v, short=short)
    grid = (-(-max_q_len // tuning.block_m), q.shape[1], cu_seqlens_q.shape[0] - 1)
    if chosen is None and tuning.kernel == "hopper_persistent":
        tuning = _one_unit_per_program(tuning, math.prod(grid), q.device)
    if tuning.kernel in HOPPER_KERNELS:
        from mlakit.kernels.hopper_prefill import plan_launch

        return plan_launch(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, out, lse, max_q_len=max_q_len, causal=causal,
                           merge=merge, block_n=tuning.block_n, stages=tuning.num_stages,
                           persistent=tuning.kernel == "hopper_persistent")
    nope_dim, rope_dim, v_dim = k_nope.shape[-1], k_pe.shape[-1], v.shape[-1]
    tensors = (q, k_nope, k_pe, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    strides = (q.stride(0), q.stride(1), k_nope.stride(0), k_nope.stride(1), k_pe.stride(0), v.stride(0), v.stride(1),
               out.stride(0), out.stride(1), lse.stride(0))
    key = (tuple([(t.dtype, t.data_ptr() % 16) for t in tensors]), strides, nope_dim, rope_dim, v_dim, tuning, causal,
           merge)
    constants = _kernel_constants(nope_dim, rope_dim, v_dim, tuning, causal, merge)
    return PortableLaunch(key, grid, strides, MappingProxyType(constants))


def _one_unit_per_program(tuning: PrefillTuning, units: int, device: torch.device) -> PrefillTuning:
    """The persistent default's tiles in the one-program-per-row-block kernel where the pass has at most half as
    many units (row blocks x heads x segments) as the GPU has SMs: no program would take a second unit, so the
    persistent kernel's unit counter and hand-over only cost (16 heads x 512 tokens, 64 units: 13.5 against 15.2
    us in a CUDA graph; level at 128 units: NOTES.md p31)."""
    from mlakit.kernels.hopper_prefill import sm_count

    return dataclasses.replace(tuning, kernel="hopper") if 2 * units <= sm_count(device) else tuning


def _tuning_for(tuning: PrefillTuning | None, q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor,
                v: torch.Tensor, short: bool = False) -> PrefillTuning:
    """The tuning a call runs: the caller's (a hopper or hopper_persistent one refused where that kernel
    cannot take the operands), else the persistent Hopper kernel's where it can (`HOPPER_TUNING`, or
    `SHORT_HOPPER_TUNING` for a `short` pass; faster than the portable one on every case measured:
    benchmarks/NOTES.md, p5-p11), else the device's portable tiles."""
    if tuning is None or tuning.kernel in HOPPER_KERNELS:
        from mlakit.kernels import hopper_prefill

        if hopper_prefill.supports(q, k_nope, k_pe, v):
            return tuning or (SHORT_HOPPER_TUNING if short else HOPPER_TUNING)
        if tuning is not None:
            raise MLAInputError(
                "tuning: the hopper kernel needs an SM90 GPU, bf16 or fp16 q, k and v of one dtype (or e4m3, v transposed: "
                "`mlakit.prefill.fp8`), d_nope 64 or 128, "
                "d_rope 32 or 64, d_v 64 or 128 and 16-byte aligned addresses and strides; got "
                f"{q.dtype} on {q.device}, widths {k_nope.shape[-1]}, {k_pe.shape[-1]}, {v.shape[-1]}"
            )
    return tuning or default_prefill_tuning(q.device)


@functools.lru_cache(maxsize=64)
def _kernel_constants(nope_dim: int, rope_dim: int, v_dim: int, tuning: PrefillTuning, causal: bool,
                      merge: bool) -> dict[str, object]:
    """The prefill kernel's constexprs and launch options (kept: `triton.next_power_of_2` costs host time)."""
    return dict(
        NOPE_DIM=nope_dim, ROPE_DIM=rope_dim, V_DIM=v_dim,
        BLOCK_NOPE=max(16, triton.next_power_of_2(nope_dim)),
        BLOCK_ROPE=max(16, triton.next_power_of_2(rope_dim)),
        BLOCK_V=max(16, triton.next_power_of_2(v_dim)),
        BLOCK_M=tuning.block_m, BLOCK_N=tuning.block_n, CAUSAL=causal, MERGE=merge,
        num_warps=tuning.num_warps, num_stages=tuning.num_stages,
    )


_PREFILL = CachedLaunch(_mha_prefill_kernel)
