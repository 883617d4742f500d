"""Portable Triton MLA decode: paged, split-KV, with an lse combine.

One program owns a tile of BLOCK_M query rows (rows = query tokens x heads of one
sequence, so every head of a tile shares each KV tile it loads) and one split of the
sequence's KV tiles. Sequences with one split write their output directly; the others
write partials (float32; the Hopper seesaw's in the output's 16-bit dtype where it holds them, the narrow fp8
kernel's in fp16 and the cache's units) that the combine kernel merges by lse.

Runs wherever Triton runs, including the CPU interpreter (TRITON_INTERPRET=1), where
bf16/fp16 dot operands are upcast to float32 because the interpreter multiplies them
on raw bits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from mlakit.kernels import decode_split_plan, hopper_common, hopper_decode, hopper_narrow_decode
from mlakit.kernels.decode_split_plan import (MAX_WORK_ROWS, WORK_FIELDS, SplitGeometry, decode_split_counts,
                                             split_geometry)
from mlakit.kernels.interpreter import INTERPRET
from mlakit.kernels.launch import CachedLaunch
from mlakit.kernels.seesaw_layout import decode_page_size_hint, seesaw_pages
from mlakit.cache.kv_quant import FP8_DTYPE, SCALE_GROUP, SCALE_PER_GROUP
from mlakit.cache.kv_quant import scale_mode as kv_scale_mode
from mlakit.device import sm_count
from mlakit.errors import MLAInputError, checked_kv_tokens_hint, checked_page_size_hint
from mlakit.reference import pages_view

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
INTERPRETER_SMS = 4
# Partials the combine merges per step (their loads in flight together), and partial values per
# program and step for batches that fill the GPU alone (`combine_tiling`).
COMBINE_SPLITS_PER_STEP = 16
COMBINE_BATCH_SPLITS_PER_STEP = 4
COMBINE_VALUES = 4096
# Rows, and warps, a program of the combine that merges only an equal-share plan's partials (`share_combine_tiling`):
# launched where it finds nothing to merge, 2-row programs cost 128 heads x 64 x 1024 x 2 tokens 5 us, 8-row ones 1 us
# (NOTES.md, thirty-second session).
SHARE_COMBINE_ROWS = 8
TIERS = frozenset({"auto", "portable"})


@triton.jit
def _load_kv_part(
    KV, KV_SCALE, row_base, scale_base, cols, col_ok, tok_ok, COL_OFFSET: tl.constexpr,
    SCALE_MODE: tl.constexpr, SCALE_GROUP_SIZE: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    mask = tok_ok[:, None] & col_ok[None, :]
    values = tl.load(KV + row_base[:, None] + COL_OFFSET + cols[None, :], mask=mask, other=0.0)
    if SCALE_MODE == 2:
        group = (COL_OFFSET + cols) // SCALE_GROUP_SIZE
        scales = tl.load(KV_SCALE + scale_base[:, None] + group[None, :], mask=mask, other=0.0)
        values = values.to(tl.float32) * scales
    if INTERPRET:
        return values.to(tl.float32)
    return values.to(OUT_DTYPE)


# The block table's width changes from step to step: never specialized on (Triton would compile
# one more variant whenever it happens to be 1 or a multiple of 16).
@triton.jit(do_not_specialize=["stride_bt_b"])
def _mla_decode_split_kernel(
    Q, KV, KV_SCALE, BLOCK_TABLE, SEQLENS, WORK,
    OUT, LSE, PART_OUT, PART_LSE,
    scale_log2,
    Q_STRIDES, KV_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, PART_STRIDES, SCALE_STRIDES,
    HEADS: tl.constexpr, PAGE_SIZE: tl.constexpr,
    KV_LORA_RANK: tl.constexpr, ROPE_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_ROPE: tl.constexpr,
    SCALE_MODE: tl.constexpr, SCALE_GROUP_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    entry = WORK + tl.program_id(1) * WORK_FIELDS
    b = tl.load(entry)
    split = tl.load(entry + 1)
    num_splits = tl.load(entry + 2)
    first_token = tl.load(entry + 3)
    q_len = tl.load(entry + 4)
    tile = tl.program_id(0)
    if split >= num_splits or tile * BLOCK_M >= q_len * HEADS:
        return
    seqlen = tl.load(SEQLENS + b)
    start = tl.load(entry + 5)
    end = tl.minimum(seqlen, tl.load(entry + 6))

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len * HEADS
    draft = rows // HEADS
    head = rows % HEADS
    visible = seqlen - q_len + draft + 1
    cols_r = tl.arange(0, BLOCK_R)
    cols_p = tl.arange(0, BLOCK_ROPE)
    r_ok = cols_r < KV_LORA_RANK
    p_ok = cols_p < ROPE_DIM
    q_rows = Q + (first_token + draft)[:, None].to(tl.int64) * Q_STRIDES[0] + head[:, None] * Q_STRIDES[1]
    q_lat = tl.load(q_rows + cols_r[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
    q_pe = tl.load(q_rows + KV_LORA_RANK + cols_p[None, :], mask=row_ok[:, None] & p_ok[None, :], other=0.0)
    if INTERPRET:
        q_lat = q_lat.to(tl.float32)
        q_pe = q_pe.to(tl.float32)
    else:
        q_lat = q_lat.to(DOT_DTYPE)
        q_pe = q_pe.to(DOT_DTYPE)

    kv_scale = 1.0
    if SCALE_MODE == 1:
        kv_scale = tl.load(KV_SCALE)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for tok0 in range(start, end, BLOCK_N):
        toks = tok0 + tl.arange(0, BLOCK_N)
        tok_ok = toks < end
        page = tl.load(BLOCK_TABLE + b * stride_bt_b + toks // PAGE_SIZE, mask=tok_ok, other=0).to(tl.int64)
        offset = toks % PAGE_SIZE
        row_base = page * KV_STRIDES[0] + offset * KV_STRIDES[1]
        scale_base = page * SCALE_STRIDES[0] + offset * SCALE_STRIDES[1]
        k_lat = _load_kv_part(KV, KV_SCALE, row_base, scale_base, cols_r, r_ok, tok_ok, 0,
                              SCALE_MODE, SCALE_GROUP_SIZE, DOT_DTYPE)
        k_pe = _load_kv_part(KV, KV_SCALE, row_base, scale_base, cols_p, p_ok, tok_ok, KV_LORA_RANK,
                             SCALE_MODE, SCALE_GROUP_SIZE, DOT_DTYPE)
        scores = tl.dot(q_lat, tl.trans(k_lat)) + tl.dot(q_pe, tl.trans(k_pe))
        seen = tok_ok[None, :] & (toks[None, :] < visible[:, None])
        scores = tl.where(seen, scores * (scale_log2 * kv_scale), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_lat.dtype), k_lat)
        m_i = m_new

    has_keys = l_i > 0
    out = tl.where(has_keys[:, None], acc * (kv_scale / tl.where(has_keys, l_i, 1.0))[:, None], 0.0)
    lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2, float("-inf"))
    out_mask = row_ok[:, None] & r_ok[None, :]
    if num_splits == 1:
        tl.store(_output_rows(OUT, OUT_STRIDES, first_token, draft, head) + cols_r[None, :], out.to(OUT.dtype.element_ty),
                 mask=out_mask)
        tl.store(_lse_pointers(LSE, LSE_STRIDES, first_token, b, draft, head), lse, mask=row_ok)
    else:
        part_po_b, part_po_s, part_po_row, part_pl_b, part_pl_s = PART_STRIDES
        tl.store(PART_OUT + b * part_po_b + split * part_po_s + rows[:, None] * part_po_row + cols_r[None, :],
                 out, mask=out_mask)
        tl.store(PART_LSE + b * part_pl_b + split * part_pl_s + rows, lse, mask=row_ok)


@triton.jit
def _output_rows(OUT, OUT_STRIDES, first_token, draft, head):
    """Pointers to the output rows `[rows, 1]` of draft tokens `draft` and heads `head` of a sequence."""
    return OUT + (first_token + draft)[:, None].to(tl.int64) * OUT_STRIDES[0] + head[:, None] * OUT_STRIDES[1]


@triton.jit
def _lse_pointers(LSE, LSE_STRIDES, first_token, b, draft, head):
    """Pointers to the lse of draft tokens `draft` and heads `head` of sequence b (its first token first_token)."""
    stride_cu, stride_b, stride_draft, stride_head = LSE_STRIDES
    return LSE + first_token * stride_cu + b * stride_b + draft * stride_draft + head * stride_head


# Whether the combine may run as a programmatic dependent launch of the SM90 split passes (`combine_after_split` says
# where): it loads the plan's entries while the split pass ends and waits in `griddepcontrol.wait` for its partials
# (NOTES.md v56b). Experiments set it False for a plain launch (benchmarks/experiments/setting_ab.py).
COMBINE_AFTER_SPLIT = True
# Whether the combine's programs with nothing to merge leave without waiting for the split pass (all but the first,
# which waits so that the launch never ends before the split pass), so that they free their SMs at once.
COMBINE_IDLE_EXIT = True
# Whether the narrow kernel writes its partials in fp16 and in the cache's units (before the per-tensor scale, which
# the combine applies): a normalized partial is a convex combination of e4m3 values, at most 448 in magnitude, so fp16
# holds it to 11 bits; half the bytes of float32 partials to store and to combine (NOTES.md v83).
NARROW_FP16_PARTIALS = True


@triton.jit
def _mla_decode_combine_kernel(
    PART_OUT, PART_LSE, NUM_SPLITS, CU_SEQLENS_Q, OUT, LSE, PART_STRIDES, OUT_STRIDES, LSE_STRIDES, PART_SCALE,
    WORK_STATE,
    HEADS: tl.constexpr, KV_LORA_RANK: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr, AFTER_SPLIT: tl.constexpr = False,
    SCALED_PARTS: tl.constexpr = False, IDLE_EXIT: tl.constexpr = False, ONLY_SHARES: tl.constexpr = False,
):
    """Merges the split sequences' partials by lse (float32 or 16-bit; with SCALED_PARTS fp16 ones in the cache's
    units, the merged rows multiplied by the one-element PART_SCALE). With AFTER_SPLIT (launched as a programmatic dependent of the
    split pass, SM90), the plan's entries load while the split pass ends, and the partials only once it has. This
    launch must not end before the split pass, whose outputs the next kernel reads (in a CUDA graph it depends on this
    launch alone): the first program waits for it whatever it finds; with IDLE_EXIT the others with nothing to merge
    leave at once (the plan's entries were written before the split pass started), else they wait too. With
    ONLY_SHARES (behind a seesaw that merges every other plan itself, `hopper_decode.Merges.ALL_BUT_SHARES`) it merges
    only an equal-share plan's partials (WORK_STATE[2], the plan's order, is ORDER_SHARES)."""
    b = tl.program_id(0)
    row_block = tl.program_id(1)
    num_splits = tl.load(NUM_SPLITS + b)
    first_token = tl.load(CU_SEQLENS_Q + b)
    q_len = tl.load(CU_SEQLENS_Q + b + 1) - first_token
    idle = (num_splits <= 1) | (row_block * BLOCK_ROWS >= q_len * HEADS)
    if ONLY_SHARES:
        idle = idle | (tl.load(WORK_STATE + 2) != decode_split_plan.ORDER_SHARES)
    if AFTER_SPLIT:
        if IDLE_EXIT:
            first_program = (b == 0) & (row_block == 0) & (tl.program_id(2) == 0)
            if idle & ~first_program:
                return
        gdc_wait()
    if idle:
        return
    rows = row_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < q_len * HEADS
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < KV_LORA_RANK
    stride_po_b, stride_po_s, stride_po_row, stride_pl_b, stride_pl_s = PART_STRIDES
    lse_rows = PART_LSE + b * stride_pl_b + rows
    part_rows = PART_OUT + b * stride_po_b + rows[:, None] * stride_po_row + cols[None, :]
    part_ok = row_ok[:, None] & col_ok[None, :]
    m = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    acc = tl.zeros([BLOCK_ROWS, BLOCK_C], dtype=tl.float32)
    # BLOCK_SPLITS partials per step, their loads all in flight, merged against a running max.
    for first in range(0, num_splits, BLOCK_SPLITS):
        splits = first + tl.arange(0, BLOCK_SPLITS)
        lses = tl.load(lse_rows[None, :] + splits[:, None] * stride_pl_s,
                       mask=(splits < num_splits)[:, None] & row_ok[None, :], other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lses, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        rescale = tl.exp(m - m_safe)
        total *= rescale
        acc *= rescale[:, None]
        for step in tl.static_range(BLOCK_SPLITS):
            split = first + step
            # `!= 0`: Triton 3.9's interpreter types `mask & scalar condition` int32, which its loads refuse as a mask.
            split_ok = split < num_splits
            lse = tl.load(lse_rows + split * stride_pl_s, mask=(row_ok & split_ok) != 0, other=float("-inf"))
            weight = tl.exp(lse - m_safe)
            total += weight
            acc += tl.load(part_rows + split * stride_po_s, mask=(part_ok & split_ok) != 0, other=0.0) * weight[:, None]
        m = m_new
    safe_total = tl.where(total > 0, total, 1.0)
    if SCALED_PARTS:
        acc *= tl.load(PART_SCALE)
    draft = rows // HEADS
    head = rows % HEADS
    out_rows = _output_rows(OUT, OUT_STRIDES, first_token, draft, head)
    tl.store(out_rows + cols[None, :], (acc / safe_total[:, None]).to(OUT.dtype.element_ty), mask=part_ok)
    if tl.program_id(2) == 0:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        lse = tl.where(total > 0, m_safe + tl.log(safe_total), float("-inf"))
        tl.store(_lse_pointers(LSE, LSE_STRIDES, first_token, b, draft, head), lse, mask=row_ok)


@dataclasses.dataclass(frozen=True)
class CombineTiling:
    """One combine program's tile: `rows` rows x `columns` columns of `splits` partials at a time, over `warps`
    warps."""

    splits: int
    rows: int
    columns: int
    warps: int = 4


def combine_tiling(max_splits: int, kv_lora_rank: int) -> CombineTiling:
    """Up to 2 x COMBINE_SPLITS_PER_STEP splits per sequence (batches that fill the GPU alone): whole
    latent rows, COMBINE_BATCH_SPLITS_PER_STEP partials per step; more (small batches of long sequences):
    one row and 128 columns, COMBINE_SPLITS_PER_STEP partials per step, so that even batch 1 spreads its
    splits over every SM. (H100, NOTES.md v13 and v30: a combine walking the partials one at a time
    waits a memory round trip per split, ~0.3 us each.)

    >>> combine_tiling(max_splits=132, kv_lora_rank=512)
    CombineTiling(splits=16, rows=1, columns=128, warps=4)
    >>> combine_tiling(max_splits=9, kv_lora_rank=512)
    CombineTiling(splits=4, rows=2, columns=512, warps=4)
    """
    if _whole_rows(max_splits):
        columns = triton.next_power_of_2(kv_lora_rank)
        rows = max(1, COMBINE_VALUES // (COMBINE_BATCH_SPLITS_PER_STEP * columns))
        return CombineTiling(COMBINE_BATCH_SPLITS_PER_STEP, rows, columns)
    return CombineTiling(COMBINE_SPLITS_PER_STEP, 1, min(128, triton.next_power_of_2(kv_lora_rank)))


def share_combine_tiling(kv_lora_rank: int) -> CombineTiling:
    """The tiling of a combine behind a seesaw that merges every plan but an equal-share one itself
    (`hopper_decode.Merges.ALL_BUT_SHARES`, split ceilings of at most `hopper_decode.dispatch.MERGE_MAX_SPLITS`):
    SHARE_COMBINE_ROWS whole latent rows a program, one warp a row, so that where it finds nothing to merge it
    launches few programs.

    >>> share_combine_tiling(512)
    CombineTiling(splits=4, rows=8, columns=512, warps=8)
    """
    return CombineTiling(COMBINE_BATCH_SPLITS_PER_STEP, SHARE_COMBINE_ROWS, triton.next_power_of_2(kv_lora_rank),
                         SHARE_COMBINE_ROWS)


def _whole_rows(max_splits: int) -> bool:
    """Whether the combine's programs take whole latent rows (`combine_tiling`), rather than one row's columns."""
    return max_splits <= 2 * COMBINE_SPLITS_PER_STEP


# The most query rows a sequence may have for a combine walking them one row at a time to be a programmatic
# dependent launch (128 heads at batch 1 measured 3-7% slower so; NOTES.md v56b, v60).
PDL_MAX_ONE_ROW_COMBINE_ROWS = 64


def combine_after_split(kernel: str, max_rows: int, max_splits: int) -> bool:
    """Whether the combine runs as a programmatic dependent launch of the split pass: behind the SM90 kernels
    ("hopper", "narrow") where its programs take whole rows (split ceilings of at most 2 x
    COMBINE_SPLITS_PER_STEP: on 132 SMs from 4-7 sequences at 128 heads, 13 at 16) or where a sequence has at
    most PDL_MAX_ONE_ROW_COMBINE_ROWS query rows (`max_rows`). The seesaw lets it launch once a program of a
    non-ragged plan is past its last unit's tile loop, if that unit's sequence has at most
    EARLY_TRIGGER_MAX_SPLITS splits; else as the programs exit. Measured on the H100 (NOTES.md v56b, v59, v60):
    1-6% faster there; a combine let launch early behind one long sequence of many splits took 18-32% longer.

    >>> combine_after_split("hopper", 128, 25), combine_after_split("narrow", 16, 396)
    (True, True)
    >>> combine_after_split("hopper", 128, 396), combine_after_split("portable", 16, 25)
    (False, False)
    """
    few_rows = max_rows <= PDL_MAX_ONE_ROW_COMBINE_ROWS
    return COMBINE_AFTER_SPLIT and kernel in ("narrow", "hopper") and (_whole_rows(max_splits) or few_rows)


# A split reads at least this many KV tiles: short ones spread a small batch over more SMs, but each
# writes a partial (rows x kv_lora_rank values) the combine reads again (H100: NOTES.md, v26); at least
# BATCHED_MIN_TILES_PER_SPLIT in batches of `decode_split_plan.BATCHED_SEQUENCES` busy sequences or more, which
# fill the SMs with fewer, longer splits (16 heads, 16 x 1024: 4-11% faster; batch 1 would lose 13-25%: v62).
MIN_TILES_PER_SPLIT = 2
BATCHED_MIN_TILES_PER_SPLIT = 4


@dataclasses.dataclass(frozen=True)
class DecodeTuning:
    """Launch shape of the portable kernel. `programs_per_sm` sizes the split plan (how many
    programs one SM runs at once); `fixed_splits` replaces the balanced plan with the same
    split count for every sequence (the simple engines' scheme). `tier` picks the split
    kernel: "auto" takes a Hopper kernel where one serves the tile and the call (64-row tiles:
    `hopper_decode`; 16- or 32-row, 4-warp, 64-token tiles: `hopper_narrow_decode`) and the portable
    one elsewhere; "portable" forces the portable one."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 2
    programs_per_sm: int = 2
    fixed_splits: int | None = None
    tier: str = "auto"

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"DecodeTuning.tier: expected one of {sorted(TIERS)}, got {self.tier!r}")
        if self.fixed_splits is not None and self.fixed_splits < 1:
            raise ValueError(f"DecodeTuning.fixed_splits: expected None or at least 1, got {self.fixed_splits}")


def default_tuning(rows: int, *, hopper_tier: bool = False, kv_dtype: torch.dtype | None = None) -> DecodeTuning:
    """Row tile sized to the rows of one sequence (query tokens x heads). 16-row tiles use
    32-token KV tiles so several programs share an SM; 32- and 64-row tiles fill one SM each
    (measured on H100: benchmarks/NOTES.md, v4). Where the Hopper kernels serve the cache
    (`hopper_tier`), every row count takes their 64-row tile: it overlaps loads with the math,
    so padded rows cost nothing while the KV read bounds a 16-bit cache's time (NOTES.md, v12);
    fp8 caches with at most 32 rows take the narrow kernel's 16-row tiles, two programs per SM
    (`hopper_narrow_decode`, NOTES.md v27).

    >>> default_tuning(16).block_m, default_tuning(16, hopper_tier=True).block_m
    (16, 64)
    >>> default_tuning(16, hopper_tier=True, kv_dtype=torch.float8_e4m3fn).block_m
    16
    """
    if hopper_tier and kv_dtype == FP8_DTYPE and rows <= hopper_narrow_decode.MAX_ROWS:
        narrow = hopper_narrow_decode
        return DecodeTuning(block_m=narrow.ROWS.value, block_n=hopper_common.BLOCK_N.value,
                            num_warps=narrow.NUM_WARPS, programs_per_sm=narrow.PROGRAMS_PER_SM)
    if rows <= 16 and not hopper_tier:
        return DecodeTuning(block_m=16, block_n=32, num_warps=4, programs_per_sm=4)
    if rows <= 32 and not hopper_tier:
        return DecodeTuning(block_m=32, block_n=64, num_warps=8, programs_per_sm=1)
    return DecodeTuning(block_m=64, block_n=64, num_warps=8, programs_per_sm=1)


# A decode or extend call prepared for one input layout (`prepare_call`).
PreparedCall = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """How one launch is split: launch shape, split ceiling, and on the device the query
    offsets, per-sequence split counts, the work items (one per split of a sequence, in launch
    order, longest splits first: `decode_split_counts`; fixed-split plans keep batch order), the
    work state (their count, the persistent kernel's unit counter, the units' order) and the merge
    state (per sequence and 64-row tile, the splits written so far, for the kernel that merges its own
    partials: `hopper_decode.prepare`); every counter is back at zero after a launch,
    so the calls of one plan must run one after another, as a model's layers do. Build it once per step (`plan_decode`,
    `plan_extend`); every layer reuses it. `hopper_default`: the tuning is the Hopper tier's
    tile, chosen because device and cache dtype suit that tier; a call its kernel does not take
    after all (a page size the narrow kernel cannot box, per-group fp8 scales, odd strides) runs
    the 64-row Hopper kernel, else the portable kernel with its default tile, over the same split
    counts (`split_kernel_for`; unless the tuning's tier was set to "portable"). `e4m3_scores`: where a Hopper kernel
    takes fp8 pages at DeepSeek's widths (the seesaw or the narrow one), it rounds the query rows to e4m3 and computes
    S on 8-bit tensor cores (`hopper_decode.prepare`, `hopper_narrow_decode.prepare`). `may_share`: whether the plan
    kernel could take equal shares (planned for the seesaw's pages: `decode_split_plan.may_share`); only then does the
    seesaw launch a combine behind it for a share plan's merges. `unit_tiles_hint`: about how many KV tiles a work unit
    holds, where the plan was told the batch's cached tokens (`decode_split_plan.unit_tiles_hint`; None where not), for
    the seesaw's variants that pay only on long units (`hopper_decode.dispatch.left_scores_ahead`); a speed hint, left
    out of comparisons: a plan refilled in place by a re-plan (the FlashInfer drop-in's CUDA-graph mode) keeps the
    kernels its first plan chose."""

    tuning: DecodeTuning
    geometry: SplitGeometry
    cu_seqlens_q: torch.Tensor
    num_splits: torch.Tensor
    work: torch.Tensor
    work_state: torch.Tensor
    merge_state: torch.Tensor
    max_q_len: int
    hopper_default: bool = False
    e4m3_scores: bool = False
    may_share: bool = False
    unit_tiles_hint: int | None = dataclasses.field(default=None, compare=False)
    launches: dict[tuple, Callable[..., None]] = dataclasses.field(default_factory=dict, init=False, compare=False,
                                                                   repr=False)


def plan_decode(
    cache_seqlens: torch.Tensor,
    *,
    q_len: int,
    heads: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    num_sms: int | None = None,
    tuning: DecodeTuning | None = None,
    e4m3_scores: bool = False,
    kv_tokens_hint: int | None = None,
    page_size: int | None = None,
) -> DecodePlan:
    """The split plan for a decode batch with `q_len` query tokens per sequence (no host sync).

    `kv_dtype` is the cache's storage dtype (it decides whether the Hopper kernel serves the
    call, hence the row tile); `num_sms` overrides the device's SM count (tests use it to
    force many splits on small inputs); `tuning` overrides the launch shape; `e4m3_scores` (`DecodePlan`)
    lets the Hopper kernel round queries to e4m3 over fp8 pages. `kv_tokens_hint`: the batch's cached tokens in all
    (the sum of `cache_seqlens`) as the caller knows it on the host, for tiles that pay only on large batches
    (`wide_narrow_tile`) and kernel variants that pay only on long work units (`DecodePlan.unit_tiles_hint`);
    `page_size`: the cache's tokens per page, where the caller knows it, for plans that suit only the persistent seesaw
    kernel (which serves pages of whole 64-token tiles; `split_kernel_for`): equal shares, of uniform and of ragged
    batches (`decode_split_plan.may_share`). A wrong hint costs speed, never correctness.
    """
    batch = cache_seqlens.shape[0]
    cu_seqlens_q = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=cache_seqlens.device)
    return _plan(cache_seqlens, cu_seqlens_q, q_len, heads, kv_dtype, num_sms, tuning, e4m3_scores, kv_tokens_hint,
                 page_size)


def plan_extend(
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    max_q_len: int,
    heads: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    num_sms: int | None = None,
    tuning: DecodeTuning | None = None,
    e4m3_scores: bool = False,
    kv_tokens_hint: int | None = None,
    page_size: int | None = None,
) -> DecodePlan:
    """The split plan for ragged new-token segments (`cu_seqlens_q`, at most `max_q_len` each; `e4m3_scores`,
    `kv_tokens_hint` and `page_size` as `plan_decode`'s)."""
    return _plan(cache_seqlens, cu_seqlens_q, max_q_len, heads, kv_dtype, num_sms, tuning, e4m3_scores, kv_tokens_hint,
                 page_size)


def _plan(
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_q_len: int,
    heads: int,
    kv_dtype: torch.dtype,
    num_sms: int | None,
    tuning: DecodeTuning | None,
    e4m3_scores: bool,
    kv_tokens_hint: int | None,
    page_size: int | None,
) -> DecodePlan:
    kv_tokens_hint = checked_kv_tokens_hint(kv_tokens_hint)
    page_size = checked_page_size_hint(page_size)
    batch = cache_seqlens.shape[0]
    rows = max(1, max_q_len * heads)
    hopper_default = tuning is None and not INTERPRET and hopper_common.serves(cache_seqlens.device, kv_dtype)
    sms = num_sms or sm_count(cache_seqlens.device, off_gpu=INTERPRETER_SMS)
    tuning = tuning or default_tuning(rows, hopper_tier=hopper_default, kv_dtype=kv_dtype)
    if hopper_default and e4m3_scores:
        tuning = wide_narrow_tile(tuning, rows, kv_tokens_hint, sms, batch)
    row_tiles = -(-rows // tuning.block_m)
    if tuning.fixed_splits is not None:
        geometry = SplitGeometry(row_tiles=row_tiles, max_splits=tuning.fixed_splits)
    else:
        geometry = split_geometry(batch, rows, tuning.block_m, sms, tuning.programs_per_sm)
    if batch * geometry.max_splits > MAX_WORK_ROWS:
        raise ValueError(f"cache_seqlens: {batch} sequences x a split ceiling of {geometry.max_splits} is more work "
                         f"rows than the launch grid holds ({MAX_WORK_ROWS}); split the batch")
    merge_state = torch.zeros(batch * -(-rows // hopper_decode.BLOCK_M.value), dtype=torch.int32,
                              device=cache_seqlens.device)
    hopper_tile = hopper_default and tuning.block_m == hopper_decode.BLOCK_M.value
    persistent = hopper_tile and page_size is not None and seesaw_pages(page_size)
    unit_cost_tiles = decode_split_plan.HOPPER_UNIT_COST_TILES if hopper_tile else 0
    num_splits, work, work_state = decode_split_counts(
        cache_seqlens, cu_seqlens_q, heads, geometry, tuning.block_m, tuning.block_n, sms, tuning.programs_per_sm,
        min_tokens_per_split=MIN_TILES_PER_SPLIT * tuning.block_n,
        batched_min_tokens_per_split=BATCHED_MIN_TILES_PER_SPLIT * tuning.block_n,
        unit_cost_tiles=unit_cost_tiles, piece_cost_tiles=decode_split_plan.HOPPER_SHARE_PIECE_COST_TILES,
        forced_splits=tuning.fixed_splits or 0, persistent=persistent,
    )
    unit_tiles = decode_split_plan.unit_tiles_hint(kv_tokens_hint, batch, geometry.row_tiles, tuning.block_n,
                                                   tuning.programs_per_sm * sms)
    return DecodePlan(tuning, geometry, cu_seqlens_q, num_splits, work, work_state, merge_state, max_q_len,
                      hopper_default, e4m3_scores, decode_split_plan.may_share(persistent, unit_cost_tiles), unit_tiles)


def wide_narrow_tile(tuning: DecodeTuning, rows: int, kv_tokens_hint: int | None, num_sms: int,
                     batch: int) -> DecodeTuning:
    """The narrow kernel's tile with e4m3 scores (`hopper_narrow_decode`): its E4M3_ROWS-row tile in place of the
    16-row one where a sequence has more than 16 query rows and either the caller's hint of the batch's cached tokens
    gives each of the `programs_per_sm` x SMs programs WIDE_MIN_TILES_PER_PROGRAM 64-token tiles or more (one
    program reads each KV tile for all its rows, instead of two; smaller batches keep the two programs'
    parallelism, NOTES.md v65) or the `batch` sequences' 16-row tiles alone are more programs than run at once
    (they could not fit one wave even at one split a sequence, NOTES.md v86; `batch` as launched: a CUDA-graph
    bucket's padding counts); `tuning` unchanged otherwise.

    >>> narrow = default_tuning(32, hopper_tier=True, kv_dtype=torch.float8_e4m3fn)
    >>> [wide_narrow_tile(narrow, 32, hint, num_sms=132, batch=1).block_m for hint in (None, 64 * 1583, 64 * 1584)]
    [16, 16, 32]
    >>> [wide_narrow_tile(narrow, 32, None, num_sms=132, batch=batch).block_m for batch in (132, 133)]
    [16, 32]
    >>> wide_narrow_tile(narrow, 16, 1 << 30, num_sms=132, batch=1000).block_m
    16
    """
    narrow = hopper_narrow_decode
    if (tuning.block_m != narrow.ROWS.value or tuning.num_warps != narrow.NUM_WARPS
            or not narrow.ROWS.value < rows <= narrow.MAX_ROWS):
        return tuning
    programs = tuning.programs_per_sm * num_sms
    many_tiles = (kv_tokens_hint is not None
                  and kv_tokens_hint // hopper_common.BLOCK_N.value >= narrow.WIDE_MIN_TILES_PER_PROGRAM * programs)
    over_one_wave = batch * -(-rows // narrow.ROWS.value) > programs
    if not (many_tiles or over_one_wave):
        return tuning
    return dataclasses.replace(tuning, block_m=narrow.E4M3_ROWS.value)


def triton_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
    plan: DecodePlan | None = None,
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    e4m3_scores: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode with mlakit's Triton kernels (inputs as in `mlakit.mla_decode`, already checked).

    `plan` is the step's split plan (built here with `num_sms` and `e4m3_scores`, `DecodePlan`'s, when not given); `out` `[batch,
    q_len, heads, kv_lora_rank]` and `lse` `[batch, heads, q_len]` receive the results when given
    (out's last dim contiguous, heads and tokens at any stride). No host sync, so the call can be
    captured in a CUDA graph.
    """
    batch, q_len, heads, _ = q.shape
    plan = plan or plan_decode(cache_seqlens, q_len=q_len, heads=heads, kv_dtype=kv_cache.dtype, num_sms=num_sms,
                               e4m3_scores=e4m3_scores,
                               page_size=decode_page_size_hint(kv_cache, kv_scale, kv_lora_rank))
    out, lse = _outputs(q, kv_lora_rank, out, lse)
    _launch(q.reshape(batch * q_len, heads, -1), kv_cache, block_table, cache_seqlens, kv_lora_rank, softmax_scale,
            kv_scale, plan, out.view(batch * q_len, heads, kv_lora_rank), lse, _lse_strides(lse))
    return out, lse


def triton_mla_extend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    max_q_len: int,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
    plan: DecodePlan | None = None,
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    e4m3_scores: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent-form extend: packed new tokens `q [T, heads, dim]` (segments `cu_seqlens_q`, each at
    most `max_q_len`, already written to the cache) attend to their sequence's cached tokens,
    causally among themselves, as `mlakit.reference_extend`. Returns out `[T, heads,
    kv_lora_rank]` and lse `[T, heads]` (natural log), written into `out` and `lse` when given.
    `plan` is the step's split plan from `plan_extend` over these `cu_seqlens_q` (built here with `num_sms` and
    `e4m3_scores` when not given). No host sync.
    """
    plan = plan or plan_extend(cache_seqlens, cu_seqlens_q, max_q_len=max_q_len, heads=q.shape[1],
                               kv_dtype=kv_cache.dtype, num_sms=num_sms, e4m3_scores=e4m3_scores,
                               page_size=decode_page_size_hint(kv_cache, kv_scale, kv_lora_rank))
    out, lse = _outputs(q, kv_lora_rank, out, lse)
    _launch(q, kv_cache, block_table, cache_seqlens, kv_lora_rank, softmax_scale, kv_scale, plan, out, lse, _lse_strides(lse))
    return out, lse


def _result_shapes(q: torch.Tensor, kv_lora_rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """out's and lse's shapes for a decode q `[batch, q_len, heads, dim]` (out `[batch, q_len, heads, rank]`,
    lse `[batch, heads, q_len]`) or a packed extend q `[tokens, heads, dim]` (`[tokens, heads, rank]`,
    `[tokens, heads]`)."""
    if q.dim() == 4:
        batch, q_len, heads, _ = q.shape
        return (batch, q_len, heads, kv_lora_rank), (batch, heads, q_len)
    tokens, heads, _ = q.shape
    return (tokens, heads, kv_lora_rank), (tokens, heads)


def _outputs(q: torch.Tensor, kv_lora_rank: int, out: torch.Tensor | None,
             lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`out` (of the queries' dtype, else MLAInputError) and `lse`, each allocated in `_result_shapes` where None."""
    out_shape, lse_shape = _result_shapes(q, kv_lora_rank)
    if out is not None and out.dtype != q.dtype:  # the Hopper kernels stage it in the queries' 16-bit buffer
        raise MLAInputError(f"out: expected the queries' dtype {q.dtype}, got {out.dtype}")
    if out is None:
        out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    return out, lse


def _lse_strides(lse: torch.Tensor) -> tuple[int, int, int, int]:
    """How the kernels address lse (first token, sequence, draft index, head): a decode lse `[batch, heads,
    q_len]` by sequence and draft index, an extend lse `[tokens, heads]` by token."""
    if lse.dim() == 3:
        return (0, lse.stride(0), lse.stride(2), lse.stride(1))
    return (lse.stride(0), 0, lse.stride(0), lse.stride(1))


def _launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
    plan: DecodePlan,
    out: torch.Tensor,
    lse: torch.Tensor,
    lse_strides: tuple[int, int, int, int],
) -> None:
    """Split kernel plus combine for packed query tokens `q [T, H, D]`; `out [T, H, R]` and lse
    addressed as first_token * s0 + sequence * s1 + draft index * s2 + head * s3.

    What depends only on the inputs' layout (the split kernel, its tile and grid, strides, the
    partial buffers) is prepared on the first call of a layout and kept in the plan; the tensors
    themselves are passed on every call, so a cache, q, page table or lengths at a new address
    are read where they now are."""
    pages = pages_view(kv_cache)
    q = q.contiguous()
    launch = _launch_for(q, pages, block_table, cache_seqlens, kv_scale, kv_lora_rank, plan, out, lse, lse_strides)
    launch(q, pages, block_table, cache_seqlens, kv_scale, softmax_scale * LOG2E, out, lse)


def _launch_for(q: torch.Tensor, pages: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
                kv_scale: torch.Tensor | None, kv_lora_rank: int, plan: DecodePlan, out: torch.Tensor, lse: torch.Tensor,
                lse_strides: tuple[int, int, int, int]) -> Callable[..., None]:
    """The plan's prepared launches for these inputs' layout (`_prepare_launch`), made on first use."""
    batch = cache_seqlens.shape[0]
    if plan.num_splits.shape[0] != batch:
        raise ValueError(f"plan: built for {plan.num_splits.shape[0]} sequences, the call has {batch} "
                         f"(cache_seqlens); build the plan from this call's lengths")
    key = layout_key(q, pages, block_table, cache_seqlens, kv_scale, out, lse, lse_strides, kv_lora_rank)
    launch = plan.launches.get(key)
    if launch is None:
        launch = plan.launches[key] = _prepare_launch(q, pages, block_table, kv_scale, kv_lora_rank, plan, out,
                                                      lse_strides, key)
    return launch


def prepare_call(
    plan: DecodePlan,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kv_scale: torch.Tensor | None,
    *,
    kv_lora_rank: int,
    return_lse: bool,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
) -> PreparedCall | None:
    """`triton_mla_decode` (a 4-D q) or `triton_mla_extend` (a packed 3-D q) over `plan`, for every later
    call whose tensors have these ones' layout (shapes, strides, dtypes, devices, pointer alignment: the
    caller keys it so), with nothing left to work out per call: `call(q, kv_cache, block_table,
    cache_seqlens, kv_scale, softmax_scale, out, lse)` allocates what is None among out and lse, launches,
    and returns out and lse (None without `return_lse`). The tensors are passed as they come (a 4-D query
    and output, FlashMLA's 4-D cache view): the launches were prepared with the strides of their 3-D
    views. None for a non-contiguous q (the call then keeps its per-call path, which copies it)."""
    if not q.is_contiguous():
        return None
    heads, dim = q.shape[-2:]
    tokens = q.numel() // (heads * dim)
    out_shape, lse_shape = _result_shapes(q, kv_lora_rank)
    device, dtype = q.device, q.dtype
    template_out, template_lse = _outputs(q, kv_lora_rank, out, lse)
    launch = _launch_for(q.view(tokens, heads, dim), pages_view(kv_cache), block_table, cache_seqlens, kv_scale,
                         kv_lora_rank, plan, template_out.view(tokens, heads, kv_lora_rank), template_lse,
                         _lse_strides(template_lse))

    def call(q, kv_cache, block_table, cache_seqlens, kv_scale, softmax_scale, out, lse):
        if out is None:
            out = torch.empty(out_shape, dtype=dtype, device=device)
        if lse is None:
            lse = torch.empty(lse_shape, dtype=torch.float32, device=device)
        launch(q, kv_cache, block_table, cache_seqlens, kv_scale, softmax_scale * LOG2E, out, lse)
        return out, (lse if return_lse else None)

    return call


def layout_key(q: torch.Tensor, pages: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
               kv_scale: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, lse_strides: tuple[int, ...],
               kv_lora_rank: int) -> tuple:
    """Everything a decode launch's kernels, tiles and Triton specializations depend on besides the plan:
    shapes, strides and dtypes of the inputs, and whether each pointer is 16-byte aligned."""
    return (
        q.shape, q.stride(), q.dtype, q.data_ptr() % 16, pages.shape, pages.stride(), pages.dtype, pages.data_ptr() % 16,
        block_table.stride(0), block_table.data_ptr() % 16, cache_seqlens.data_ptr() % 16,
        None if kv_scale is None else (kv_scale.shape, kv_scale.stride(), kv_scale.dtype, kv_scale.data_ptr() % 16),
        out.stride(), out.dtype, out.data_ptr() % 16, lse_strides, lse.data_ptr() % 16, kv_lora_rank,
    )


def _prepare_launch(
    q: torch.Tensor,
    pages: torch.Tensor,
    block_table: torch.Tensor,
    kv_scale: torch.Tensor | None,
    kv_lora_rank: int,
    plan: DecodePlan,
    out: torch.Tensor,
    lse_strides: tuple[int, int, int, int],
    key: tuple,
) -> Callable[..., None]:
    """The launches of one input layout over `plan`: `run(q, pages, block_table, cache_seqlens, kv_scale,
    scale_log2, out, lse)`."""
    batch = plan.num_splits.shape[0]
    heads = q.shape[1]
    max_rows = plan.max_q_len * heads
    scale_mode = kv_scale_mode(pages, kv_scale)
    kernel, tuning, geometry = split_kernel_for(q, pages, kv_lora_rank, scale_mode, plan)
    tiling = combine_tiling(geometry.max_splits, kv_lora_rank)
    # Both sides follow the partials' dtype: the narrow kernel leaves the scale off fp16 partials (a compile-time
    # branch on PART_OUT's dtype), the combine applies it (SCALED_PARTS); the seesaw's are the output's dtype where
    # `hopper_decode.partial_dtype` says so.
    scaled_parts = kernel == "narrow" and NARROW_FP16_PARTIALS
    if scaled_parts:
        part_dtype = torch.float16
    elif kernel == "hopper":
        part_dtype = hopper_decode.partial_dtype(out.dtype, pages, kv_lora_rank, q.shape[-1] - kv_lora_rank)
    else:
        part_dtype = torch.float32
    # The launches' key: the inputs' layout and what the plan adds to the kernels' arguments and constants.
    key = (key, kernel, tuning, geometry, tiling, plan.max_q_len, batch, scaled_parts, part_dtype)
    # Rows padded to 16 keep every partial stride a multiple of 16 whatever the batch, so the
    # kernels specialize the same way for every step (one compiled variant, see warm-up). The
    # partials are the plan's: its launches run one after another, each combine before the next split.
    part_out = torch.empty(batch, geometry.max_splits if geometry.max_splits > 1 else 0, -(-max_rows // 16) * 16,
                           kv_lora_rank, dtype=part_dtype, device=q.device)
    part_lse = torch.empty(part_out.shape[:3], dtype=torch.float32, device=q.device)
    scale_strides = (kv_scale.stride(0), kv_scale.stride(1)) if scale_mode == SCALE_PER_GROUP else (0, 0)
    part_strides = (part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1))
    out_strides = (out.stride(0), out.stride(1))
    strides = ((q.stride(0), q.stride(1)), (pages.stride(0), pages.stride(1)), block_table.stride(0), out_strides,
               lse_strides, part_strides)
    # Programs by work item (longest splits first; unused rows of the plan last), row tiles of a split adjacent.
    grid = (geometry.row_tiles, plan.work.shape[0])

    merges = hopper_decode.Merges.NONE
    if kernel == "narrow":
        split = hopper_narrow_decode.prepare(key, grid, q, pages, kv_lora_rank, plan.e4m3_scores, tuning.block_m)
    elif kernel == "hopper":
        split, merges = hopper_decode.prepare(key, grid, q, pages, kv_lora_rank, plan.work_state, plan.merge_state,
                                              geometry.max_splits, plan.e4m3_scores, plan.may_share,
                                              unit_tiles_hint=plan.unit_tiles_hint)
    else:
        split = _portable_split(key, grid, q, pages, kv_lora_rank, tuning, scale_mode, scale_strides)
    only_shares = merges == hopper_decode.Merges.ALL_BUT_SHARES
    combine_tile = share_combine_tiling(kv_lora_rank) if only_shares else tiling
    combine_grid = (batch, triton.cdiv(max_rows, combine_tile.rows), triton.cdiv(kv_lora_rank, combine_tile.columns))
    after_split = combine_after_split(kernel, max_rows, geometry.max_splits)
    combine_constants = dict(HEADS=heads, KV_LORA_RANK=kv_lora_rank, BLOCK_SPLITS=combine_tile.splits,
                             BLOCK_ROWS=combine_tile.rows, BLOCK_C=combine_tile.columns, AFTER_SPLIT=after_split,
                             SCALED_PARTS=scaled_parts, IDLE_EXIT=COMBINE_IDLE_EXIT, ONLY_SHARES=only_shares,
                             num_warps=combine_tile.warps)
    if after_split:  # a launch option only the CUDA backend knows
        combine_constants["launch_pdl"] = True
    combines = geometry.max_splits > 1 and merges != hopper_decode.Merges.ALL
    combine_key = (key, after_split, COMBINE_IDLE_EXIT, only_shares, combine_tile)

    def run(q, pages, block_table, cache_seqlens, kv_scale, scale_log2, out, lse) -> None:
        split(q, pages, kv_scale, (block_table, cache_seqlens, plan.work, out, lse, part_out, part_lse, scale_log2, *strides))
        if combines:
            # Without scaled partials the kernel never reads PART_SCALE (the lse partials fill it), nor, but for
            # ONLY_SHARES, WORK_STATE.
            _COMBINE(combine_key, combine_grid, (part_out, part_lse, plan.num_splits, plan.cu_seqlens_q, out, lse,
                                                 part_strides, out_strides, lse_strides,
                                                 kv_scale if scaled_parts else part_lse, plan.work_state),
                     combine_constants)

    return run


def _portable_split(key: tuple, grid: tuple[int, int], q: torch.Tensor, pages: torch.Tensor, kv_lora_rank: int,
                    tuning: DecodeTuning, scale_mode: int,
                    scale_strides: tuple[int, int]) -> hopper_decode.SplitPass:
    """The portable split kernel's pass for one input layout (as `hopper_decode.prepare`'s)."""
    dim = q.shape[-1]
    constants = dict(
        HEADS=q.shape[1], PAGE_SIZE=pages.shape[1], KV_LORA_RANK=kv_lora_rank, ROPE_DIM=dim - kv_lora_rank,
        BLOCK_M=tuning.block_m, BLOCK_N=tuning.block_n, BLOCK_R=triton.next_power_of_2(kv_lora_rank),
        BLOCK_ROPE=max(16, triton.next_power_of_2(dim - kv_lora_rank)),
        SCALE_MODE=scale_mode, SCALE_GROUP_SIZE=SCALE_GROUP, DOT_DTYPE=_dot_dtype(q.dtype),
        num_warps=tuning.num_warps, num_stages=_stages(tuning, scale_mode),
    )

    def split(q, pages, kv_scale, shared_args) -> None:
        # Without scales the kernel never reads SCALE: the pages fill it.
        _SPLIT(key, (*grid, 1), (q, pages, pages if kv_scale is None else kv_scale, *shared_args, scale_strides), constants)

    return split


def split_kernel_for(
    q: torch.Tensor, pages: torch.Tensor, kv_lora_rank: int, scale_mode: int, plan: DecodePlan
) -> tuple[str, DecodeTuning, SplitGeometry]:
    """Which split kernel runs `plan` on this call ("narrow", "hopper" or "portable") and with
    which tile. The plan's tile decides; where the plan took the Hopper tier's default tile but
    that tier's kernel refuses the call (a page size the narrow kernel cannot box, per-group fp8
    scales, odd strides, the narrow kernel's 32-row tile at widths other than DeepSeek's), the narrow
    kernel's 16-row tile (for a 32-row plan), else the 64-row Hopper kernel, else the portable kernel's
    default tile runs over the same split counts.

    >>> from mlakit.cache.kv_quant import SCALE_NONE
    >>> device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU interpreter runs the portable kernel only
    >>> plan = plan_decode(torch.tensor([300, 0], dtype=torch.int32, device=device), q_len=1, heads=16)
    >>> q, pages = torch.zeros(2, 16, 576, device=device), torch.zeros(10, 64, 576, device=device)
    >>> split_kernel_for(q, pages, 512, SCALE_NONE, plan)[0] in (("portable",) if device == "cpu" else ("narrow", "hopper", "portable"))
    True
    """
    tuning, geometry = plan.tuning, plan.geometry
    for kernel in ("narrow", "hopper"):
        if _takes_kernel(kernel, q, pages, kv_lora_rank, scale_mode, tuning, plan.e4m3_scores):
            return kernel, tuning, geometry
    if not plan.hopper_default or tuning.tier != "auto":
        return "portable", tuning, geometry
    rows = max(1, plan.max_q_len * q.shape[1])
    fallbacks = [("hopper", default_tuning(rows, hopper_tier=True)), ("portable", default_tuning(rows))]
    if (tuning.block_m, tuning.num_warps) == (hopper_narrow_decode.E4M3_ROWS.value, hopper_narrow_decode.NUM_WARPS):
        fallbacks.insert(0, ("narrow", dataclasses.replace(tuning, block_m=hopper_narrow_decode.ROWS.value)))
    kernel, tuning = next((kernel, tile) for kernel, tile in fallbacks
                          if kernel == "portable" or _takes_kernel(kernel, q, pages, kv_lora_rank, scale_mode, tile,
                                                                   plan.e4m3_scores))
    return kernel, tuning, dataclasses.replace(geometry, row_tiles=-(-rows // tuning.block_m))


def _takes_kernel(
    kernel: str, q: torch.Tensor, pages: torch.Tensor, kv_lora_rank: int, scale_mode: int, tuning: DecodeTuning,
    e4m3_scores: bool,
) -> bool:
    """Whether a Hopper kernel serves this tile and call: "hopper" 64-row tiles of the caches
    `hopper_decode.supports` names, "narrow" 16-row tiles (32-row ones where it `takes_rows`; four warps) of those
    `hopper_narrow_decode.supports` names, each over 64-token KV tiles and rows it can copy in 16-byte pieces."""
    if kernel == "narrow":
        tier = hopper_narrow_decode
        tile_fits = (tuning.num_warps == tier.NUM_WARPS
                     and tier.takes_rows(tuning.block_m, kv_lora_rank, q.shape[-1] - kv_lora_rank, e4m3_scores))
    else:
        tier = hopper_decode
        tile_fits = tuning.block_m == hopper_decode.BLOCK_M.value
    return (
        tuning.tier == "auto"
        and tile_fits
        and tuning.block_n == hopper_common.BLOCK_N.value
        and not INTERPRET
        and tier.supports(q.dtype, pages, scale_mode, kv_lora_rank, q.shape[-1] - kv_lora_rank)
        and hopper_decode.rows_are_contiguous(pages)
        and all(stride * t.element_size() % 16 == 0 for t in (q, pages) for stride in t.stride()[:2])
        and q.data_ptr() % 16 == 0
        and pages.data_ptr() % 16 == 0
    )


def _stages(tuning: DecodeTuning, scale_mode: int) -> int:
    """Per-group fp8 scales are gathered as a full float32 tile beside the K tile: with 64-row
    tiles two stages of both exceed Hopper's shared memory (measured: 324 KB asked), so one stage."""
    if scale_mode == SCALE_PER_GROUP and tuning.block_m >= 64:
        return 1
    return tuning.num_stages


def _dot_dtype(q_dtype: torch.dtype) -> tl.dtype:
    """The dots run in the query's dtype; K tiles (fp8 ones dequantized) are converted to it."""
    return tl.float16 if q_dtype == torch.float16 else tl.bfloat16


_SPLIT = CachedLaunch(_mla_decode_split_kernel)
_COMBINE = CachedLaunch(_mla_decode_combine_kernel)
