"""FP8 MHA-form prefill on Hopper: q, k and v rounded to e4m3 with one scale a tensor, Q K^T and P V on 8-bit
tensor cores with float32 accumulation (P rounded to e4m3 too), the output in 16-bit.

`quantize_prefill_operands` makes the operands (per-tensor scales from each tensor's largest magnitude, computed
on the device: no host sync; each key segment moved to start at a multiple of KEY_ALIGNMENT keys, since TMA reads
the transposed values from there), `fp8_mha_prefill` runs a pass with `triton_mha_prefill`'s contract (varlen
segments, bottom-right causal alignment, lse out, the merge into an earlier out / lse). Its accuracy is e4m3's (about 5e-2
of the output's scale on random data against about 3e-3 in bf16: benchmarks/NOTES.md, "FP8 prefill").
"""

from __future__ import annotations

import dataclasses

import torch

from mlakit.attention.checks import checked_softmax_scale
from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.errors import MLAInputError
from mlakit.kernels import fp8_operands
from mlakit.kernels.fp8_operands import KEY_ALIGNMENT
from mlakit.kernels.triton_prefill import HOPPER_KERNELS, LOG2E, PrefillTuning, attention_outputs, plan_attention


@dataclasses.dataclass(frozen=True)
class Fp8PrefillOperands:
    """e4m3 operands of `fp8_mha_prefill`, made by `quantize_prefill_operands`: `q [T, H, d_nope + d_rope]`,
    `k_nope [Tk, H, d_nope]`, `k_pe [Tk, d_rope]` and the values transposed, `v_t [H, d_v, Tk]` (keys contiguous:
    8-bit tensor cores read P V's operand only that way; rows KEY_ALIGNMENT keys apart; within each aligned group
    of 16 keys in `value_columns`' order), with `scales` float32
    `[2]`: q's scale times k's (shared by k_nope and k_pe), and v's. A value is its e4m3 number times its tensor's
    scale. Key segment b holds `cu_seqlens_k[b + 1] - cu_seqlens_k[b]` keys (int32 offsets of the caller's rows) and
    starts at row `key_starts[b]` (int32, a multiple of KEY_ALIGNMENT; zeros between segments); `key_rows` (int64)
    holds where each of the caller's key rows went in k_nope and k_pe, `value_columns` (int64) in v_t's last
    dimension (`value_columns(key_rows)`)."""

    q: torch.Tensor
    k_nope: torch.Tensor
    k_pe: torch.Tensor
    v_t: torch.Tensor
    scales: torch.Tensor
    cu_seqlens_k: torch.Tensor
    key_starts: torch.Tensor
    key_rows: torch.Tensor
    value_columns: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("q", "k_nope", "k_pe", "v_t"):
            tensor = getattr(self, name)
            if tensor.dtype != FP8_DTYPE:
                raise MLAInputError(f"{name}: expected {FP8_DTYPE}, got {tensor.dtype}")
            if tensor.device != self.q.device:
                raise MLAInputError(f"{name}: expected q's device {self.q.device}, got {tensor.device}")
        tokens, heads, qk_dim = self.q.shape
        keys = self.k_nope.shape[0]
        if self.k_nope.dim() != 3 or self.k_nope.shape[1] != heads:
            raise MLAInputError(f"k_nope: expected [keys, {heads}, d_nope], got {tuple(self.k_nope.shape)}")
        if self.k_pe.shape != (keys, qk_dim - self.k_nope.shape[2]):
            raise MLAInputError(f"k_pe: expected {(keys, qk_dim - self.k_nope.shape[2])}, got {tuple(self.k_pe.shape)}")
        if self.v_t.dim() != 3 or self.v_t.shape[0] != heads or self.v_t.shape[2] != keys:
            raise MLAInputError(f"v_t: expected [{heads}, d_v, {keys}], got {tuple(self.v_t.shape)}")
        strides = self.v_t.stride()
        if strides[2] != 1 or strides[1] % KEY_ALIGNMENT or strides[0] != self.v_t.shape[1] * strides[1]:
            raise MLAInputError(f"v_t: expected contiguous keys, rows {KEY_ALIGNMENT}-byte aligned (a multiple of "
                                f"{KEY_ALIGNMENT} keys apart: TMA) and heads back to back, got strides {strides}")
        for name in ("cu_seqlens_k", "key_starts"):
            offsets = getattr(self, name)
            if offsets.dtype != torch.int32 or offsets.shape != self.cu_seqlens_k.shape or offsets.dim() != 1:
                raise MLAInputError(f"{name}: expected int32 [segments + 1], got {offsets.dtype} {tuple(offsets.shape)}")
        if self.value_columns.dtype != torch.int64 or self.value_columns.shape != self.key_rows.shape:
            raise MLAInputError(f"value_columns: expected int64 {list(self.key_rows.shape)} (like key_rows), got "
                                f"{self.value_columns.dtype} {list(self.value_columns.shape)}")
        if self.scales.shape != (2,) or self.scales.dtype != torch.float32 or self.scales.device != self.q.device:
            raise MLAInputError(f"scales: expected float32 [2] on {self.q.device}, got {self.scales.dtype} "
                                f"{tuple(self.scales.shape)} on {self.scales.device}")

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k_nope, k_pe and v (`[Tk, H, d_v]`) in float32 as the kernel sees them, the keys back in the caller's
        rows, for references: k at scale 1 and q at the product of both scales (the scores come out the same)."""
        qk_scale, v_scale = self.scales
        rows = self.key_rows
        return (self.q.float() * qk_scale, self.k_nope[rows].float(), self.k_pe[rows].float(),
                self.v_t[..., self.value_columns].float().permute(2, 0, 1) * v_scale)


def quantize_prefill_operands(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
                              cu_seqlens_k: torch.Tensor) -> Fp8PrefillOperands:
    """16-bit prefill operands (`triton_mha_prefill`'s shapes; views allowed) with their key segments (int32
    offsets from 0, as `plan_prefill` makes them: keys before the first offset get no place) rounded to e4m3,
    each tensor scaled so that its largest magnitude maps to e4m3's largest (k_nope and k_pe share k's scale),
    the keys moved so that every segment starts at a multiple of KEY_ALIGNMENT keys. Three Triton launches
    (`mlakit.kernels.fp8_operands`), no host sync.

    >>> device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs them under Triton's interpreter
    >>> q, kn, kp, v = (torch.randn(s, device=device) for s in ((5, 2, 24), (5, 2, 16), (5, 8), (5, 2, 16)))
    >>> ops = quantize_prefill_operands(q, kn, kp, v, torch.tensor([0, 3, 5], dtype=torch.int32, device=device))
    >>> ops.key_starts.tolist(), ops.key_rows.tolist(), ops.value_columns.tolist(), ops.v_t.shape
    ([0, 16, 32], [0, 1, 2, 16, 17], [0, 1, 4, 16, 17], torch.Size([2, 16, 48]))
    """
    rounded = fp8_operands.round_operands(q, k_nope, k_pe, v, cu_seqlens_k)
    return Fp8PrefillOperands(**rounded._asdict(), cu_seqlens_k=cu_seqlens_k)


def value_columns(key_rows: torch.Tensor) -> torch.Tensor:
    """v_t's column of each key row: within each group of 16 keys, key 8b + 2a + c goes to column 4a + 2b + c,
    where the Hopper kernel's e4m3 P reaches P V's operand without moving between threads.

    >>> value_columns(torch.arange(16)).tolist()
    [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
    """
    low = key_rows % KEY_ALIGNMENT
    return key_rows - low + 4 * ((low >> 1) & 3) + 2 * (low >> 3) + (low & 1)


def fp8_mha_prefill(
    operands: Fp8PrefillOperands,
    cu_seqlens_q: torch.Tensor,
    *,
    max_q_len: int,
    causal: bool,
    softmax_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    merge: bool = False,
    max_k_len: int | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    tuning: PrefillTuning | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`triton_mha_prefill` on e4m3 operands (Hopper GPUs only) over their key segments (`operands.cu_seqlens_k`):
    out `[T, H, d_v]` in `out_dtype` (or written into `out`, whose dtype then rules) and lse `[T, H]` float32, or
    with `merge=True` merged into the earlier `out` / `lse` of a disjoint key set. Tiles as `triton_mha_prefill`
    picks them, or `tuning` (a hopper or hopper_persistent one).

    >>> cu, e4m3 = torch.tensor([0, 5], dtype=torch.int32), dict(dtype=FP8_DTYPE)
    >>> ops = Fp8PrefillOperands(q=torch.zeros(5, 2, 192, **e4m3), k_nope=torch.zeros(16, 2, 128, **e4m3),
    ...     k_pe=torch.zeros(16, 64, **e4m3), v_t=torch.zeros(2, 128, 16, **e4m3), scales=torch.ones(2), cu_seqlens_k=cu,
    ...     key_starts=torch.tensor([0, 16], dtype=torch.int32), key_rows=torch.arange(5), value_columns=torch.arange(5))
    >>> fp8_mha_prefill(ops, cu, max_q_len=5, causal=True, softmax_scale=0.1)
    Traceback (most recent call last):
    mlakit.errors.MLAInputError: operands: the fp8 prefill runs on SM90 GPUs with d_nope 64 or 128, d_rope 32 or 64, \
d_v 64 or 128 and 16-byte aligned rows; got cpu, widths 128, 64, 128
    """
    from mlakit.kernels import hopper_prefill

    q, k_nope, k_pe, v_t = operands.q, operands.k_nope, operands.k_pe, operands.v_t
    cu_seqlens_k = operands.cu_seqlens_k
    softmax_scale = checked_softmax_scale(softmax_scale)
    tokens, heads, _ = q.shape
    v_dim = v_t.shape[1]
    if not hopper_prefill.supports(q, k_nope, k_pe, v_t):
        raise MLAInputError(f"operands: the fp8 prefill runs on SM90 GPUs with d_nope 64 or 128, d_rope 32 or 64, "
                            f"d_v 64 or 128 and 16-byte aligned rows; got {q.device}, widths {k_nope.shape[-1]}, "
                            f"{k_pe.shape[-1]}, {v_dim}")
    if tuning is not None and tuning.kernel not in HOPPER_KERNELS:
        raise MLAInputError(f"tuning: the fp8 prefill runs the {HOPPER_KERNELS} kernels only, got {tuning.kernel!r}")
    if out is not None and out.dtype == FP8_DTYPE:
        raise MLAInputError(f"out: expected a 16-bit or float32 tensor, got {out.dtype}")
    out, lse, no_keys = attention_outputs(out, lse, (tokens, heads, v_dim), out_dtype, q.device, merge,
                                          cu_seqlens_q.shape[0] == 1 or max_q_len == 0 or k_nope.shape[0] == 0)
    if no_keys:
        return out, lse
    launch = plan_attention(q, k_nope, k_pe, v_t, cu_seqlens_q, cu_seqlens_k, out, lse, max_q_len=max_q_len,
                            causal=causal, merge=merge, tuning=tuning, max_k_len=max_k_len)
    launch(q, k_nope, k_pe, v_t, cu_seqlens_q, cu_seqlens_k, out, lse, softmax_scale * LOG2E, operands.scales,
           operands.key_starts)
    return out, lse

