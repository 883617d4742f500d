"""Host side of the Hopper decode kernels: whether they take a call (`supports`, `rows_are_contiguous`), which of them
serves a page layout (`seesaw_layout.seesaw_takes`), and the split pass prepared per input layout (`prepare`),
launched through the kernels' `CachedLaunch` objects."""
from __future__ import annotations

import enum
from collections.abc import Callable, Hashable

import torch

from mlakit.cache.kv_quant import FP8_DTYPE, SCALE_PER_TENSOR
from mlakit.device import sm_count
from mlakit.kernels.hopper_common import GLUON_DTYPES, KV_LORA_RANKS, ROPE_DIMS, serves
from mlakit.kernels.hopper_decode.constants import NUM_WARPS
from mlakit.kernels.hopper_decode.descriptors import chunk_descriptors
from mlakit.kernels.hopper_decode.fp8_split_kernel import mla_decode_hopper_fp8_kernel
from mlakit.kernels.hopper_decode.seesaw_kernel import mla_decode_hopper_seesaw_kernel
from mlakit.kernels.hopper_decode.split_kernel import mla_decode_hopper_split_kernel
from mlakit.kernels.l2_evict_first import HintedKey, evict_first_tma_loads, streams_evict_first
from mlakit.kernels.launch import CachedLaunch
from mlakit.kernels.seesaw_layout import seesaw_takes

# A prepared split pass: run(q, pages, kv_scale, shared_args).
SplitPass = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", tuple], None]


class Merges(enum.Enum):
    """Which split sequences a prepared split pass merges itself: none (the combine merges them all), all (no combine
    is launched), or all but an equal-share plan's (a combine is launched that merges only those)."""

    NONE = "none"
    ALL = "all"
    ALL_BUT_SHARES = "all but shares"


# The persistent seesaw merges its split sequences' partials itself when the plan has at most this many
# splits per sequence: batches that fill the GPU, whose few split sequences are merged while the other
# programs work. Beyond it the combine kernel, whose many programs merge faster (NOTES.md v39).
MERGE_MAX_SPLITS = 4
# Whether, under that ceiling, an equal-share plan's cut sequences are merged by a combine launched behind the seesaw
# rather than in it: a share plan's programs all end together, each merge then on the kernel's tail; plans of other
# orders keep the in-kernel merges, and the combine, launched for any plan under the ceiling that may take shares
# (the host does not know which one it took), finds nothing to do there (NOTES.md v96, v98).
SHARE_MERGES_BY_COMBINE = True
# The persistent seesaw asks L2 for a program's next unit (its query rows, its first two KV tiles) this many tile pairs
# before the unit's end (`next_unit_prefetch`; 0: never), over fp8 pages and over 16-bit ones: on fp8 2-3% faster at
# 128 heads on 4096-token batches of several units a program, ~1% at 1024 (more with e4m3 scores); on 16-bit pages it
# lost up to 5%, and two pairs ahead gained nothing on fp8 (NOTES.md v90, v90b, twenty-ninth session). On the ragged
# batches' share plans (H200, fortieth session): fp8 3-7% faster with it, 16-bit pages level (0.2-0.8% slower).
L2_PREFETCH_PAIRS_FP8 = 1
L2_PREFETCH_PAIRS_16BIT = 0
# On 16-bit pages the seesaw's warpgroup 0 issues each next tile pair's S over the left half of the latent columns
# behind its last P . V when a sequence has at least LEFT_SCORES_AHEAD_MIN_ROW_TILES row tiles (query tokens x heads /
# 64) and, where the plan was told the batch's cached tokens, its work units hold about LEFT_SCORES_AHEAD_MIN_UNIT_TILES
# KV tiles or more (`DecodePlan.unit_tiles_hint`). H200, 128 heads, against it off: units of 48-64 tiles and the ragged
# batch 1.3-2.8% faster at q_len 2, of 32 level (q_len 2) to 0.6% faster (q_len 4), of 24 0.9% slower and of 16 1.1%
# (q_len 4) to 3.2% (q_len 2) slower: a unit pays about 1.5 us more and gains about 0.1 us a tile pair. Over 495
# uniform 128-head plans at q_len 2-8 (the CPU interpreter's plan kernel, 132 SMs), 38 turns it on for 3 whose units
# run 28 tiles or fewer (plans that chose more waves) and off for 3 of 40-48. At q_len 1 (2 row tiles) 64 x 1024 was 8%
# slower; fp8 pages level to 2% slower (NOTES.md v103, v104).
LEFT_SCORES_AHEAD_MIN_ROW_TILES = 4
LEFT_SCORES_AHEAD_MIN_UNIT_TILES = 38
# Whether the seesaw writes a split's partial in the output's 16-bit dtype (`partial_dtype` says where), staged in the
# query buffer and stored in 16-byte row pieces as a finished output is, instead of float32 straight from the
# accumulator: half the bytes to store, to merge in the kernel and to combine (NOTES.md v95; v32 had tried 16-bit
# partials from the accumulator's layout, half a sector a store, and lost).
SEESAW_16BIT_PARTIALS = True


def supports(q_dtype: torch.dtype, pages: torch.Tensor, scale_mode: int, kv_lora_rank: int, rope_dim: int) -> bool:
    """Whether the Hopper kernel takes this call: an SM90 GPU; 16-bit queries and pages of the same
    dtype, or fp8 pages with one per-tensor scale; a latent width of 64, 128, 256 or 512 (each
    warpgroup's half of the output is a power-of-two tile) and a rope width of 16, 32 or 64."""
    if pages.dtype == FP8_DTYPE:
        cache_ok = scale_mode == SCALE_PER_TENSOR
    else:
        cache_ok = pages.dtype == q_dtype
    return (
        serves(pages.device, pages.dtype)
        and q_dtype in GLUON_DTYPES
        and cache_ok
        and kv_lora_rank in KV_LORA_RANKS
        and rope_dim in ROPE_DIMS
    )


def prepare(key: Hashable, grid: tuple[int, int], q: torch.Tensor, pages: torch.Tensor, kv_lora_rank: int,
            work_state: torch.Tensor, merge_state: torch.Tensor, max_splits: int,
            e4m3_scores: bool = False, may_share: bool = False,
            unit_tiles_hint: int | None = None) -> tuple[SplitPass, Merges]:
    """The split pass of one input layout (a call `supports` accepts) over `grid` = (row tiles, rows of the
    plan's work items): the persistent seesaw kernel for pages holding whole tiles (TMA loads) and latent
    widths of at least 128, 16-bit or, at DeepSeek's 512 + 64 widths, fp8 with the one-element
    `kv_scale`: one program per SM at most, over the plan's `work_state`; else the fp8 kernel for fp8
    caches, the cp.async gather kernel for 16-bit ones. `key` fixes how Triton specializes the arguments
    (`CachedLaunch`).

    Returns `run(q, pages, kv_scale, shared_args)`, where `shared_args` are the portable split kernel's
    arguments from the block table on, without the scale strides, and which split sequences' partials the kernel
    merges itself (`Merges`: the seesaw, when the plan's split ceiling `max_splits` is at most MERGE_MAX_SPLITS,
    counting splits in the plan's `merge_state`; with SHARE_MERGES_BY_COMBINE all but an equal-share plan's, where the
    plan `may_share`, `decode_split_plan.may_share`).
    `e4m3_scores`: fp8 pages on the seesaw compute S on 8-bit tensor cores, the query rows rounded to e4m3
    (`E4M3_SCORES`); other kernels ignore it. `unit_tiles_hint`: the plan's estimate of a work unit's KV tiles, None
    where it has none (`left_scores_ahead`)."""
    rope_dim = q.shape[-1] - kv_lora_rank
    constants = dict(HEADS=q.shape[1], PAGE_SIZE=pages.shape[1], KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim)
    fp8 = pages.dtype == FP8_DTYPE
    if seesaw_takes(pages.shape[1], kv_lora_rank, rope_dim, fp8):
        row_tiles, work_rows = grid
        programs = (min(sm_count(q.device), row_tiles * work_rows), 1, 1)
        merge = 1 < max_splits <= MERGE_MAX_SPLITS
        shares_to_combine = merge and SHARE_MERGES_BY_COMBINE and may_share
        if merge:
            merges = Merges.ALL_BUT_SHARES if shares_to_combine else Merges.ALL
        else:
            merges = Merges.NONE
        evict_first = streams_evict_first(row_tiles)
        e4m3 = fp8 and e4m3_scores
        prefetch = prefetch_pairs(fp8)
        ahead = left_scores_ahead(row_tiles, fp8, unit_tiles_hint)
        constants.update(MERGE=merge, SHARES_TO_COMBINE=shares_to_combine, EVICT_FIRST=evict_first, E4M3_SCORES=e4m3,
                         PREFETCH_PAIRS=prefetch, LEFT_SCORES_AHEAD=ahead, num_warps=4)
        plan_args = (work_state, work_rows, row_tiles, merge_state)

        # They follow from the plan, the call and module settings; named in the key, a kernel compiled under another
        # setting (an experiment's) is never launched in its place.
        seesaw_key = HintedKey((key, merge, shares_to_combine, e4m3, prefetch, ahead), evict_first)

        def seesaw(q, pages, kv_scale, shared_args) -> None:
            # 16-bit pages never read KV_SCALE: any tensor fills it.
            SEESAW(seesaw_key, programs, (q, *chunk_descriptors(pages, kv_lora_rank), kv_scale if fp8 else work_state,
                                   *shared_args, *plan_args, pages, pages.stride(1)), constants)

        return seesaw, merges
    launch, constants["num_warps"] = (FP8_SPLIT, 4) if fp8 else (SPLIT, NUM_WARPS.value)

    def split(q, pages, kv_scale, shared_args) -> None:
        launch(key, (*grid, 1), (q, pages, kv_scale, *shared_args) if fp8 else (q, pages, *shared_args), constants)

    return split, Merges.NONE


def partial_dtype(out_dtype: torch.dtype, pages: torch.Tensor, kv_lora_rank: int, rope_dim: int) -> torch.dtype:
    """The dtype of the split partials `prepare`'s pass writes for this call: the output's where the seesaw serves the
    pages (and `SEESAW_16BIT_PARTIALS`), float32 elsewhere. A normalized partial is a convex combination of value rows
    (times the per-tensor scale over fp8 pages): bf16 has float32's range, and over fp16 pages fp16 holds any value
    the fp16 output holds; over other pages with an fp16 output (fp8 with its scale, or bf16) a partial could pass
    fp16's range, so those stay float32.

    >>> partial_dtype(torch.bfloat16, torch.empty(4, 64, 576, dtype=torch.bfloat16), 512, 64)
    torch.bfloat16
    >>> partial_dtype(torch.bfloat16, torch.empty(4, 16, 576, dtype=torch.bfloat16), 512, 64)  # the cp.async kernel
    torch.float32
    """
    fp8 = pages.dtype == FP8_DTYPE
    if not SEESAW_16BIT_PARTIALS or not seesaw_takes(pages.shape[1], kv_lora_rank, rope_dim, fp8):
        return torch.float32
    if out_dtype == torch.bfloat16 or out_dtype == pages.dtype == torch.float16:
        return out_dtype
    return torch.float32


def prefetch_pairs(fp8: bool) -> int:
    """How many tile pairs before a unit's end the seesaw prefetches its next unit into L2 (0: never), over fp8 pages
    or 16-bit ones.

    >>> prefetch_pairs(False)
    0
    """
    return L2_PREFETCH_PAIRS_FP8 if fp8 else L2_PREFETCH_PAIRS_16BIT


def left_scores_ahead(row_tiles: int, fp8: bool, unit_tiles_hint: int | None = None) -> bool:
    """Whether the seesaw issues each next tile pair's left half of S behind the pair before's last P . V, for a plan
    of `row_tiles` row tiles a sequence over fp8 or 16-bit pages whose work units hold about `unit_tiles_hint` KV
    tiles (None: unknown, taken as long; `LEFT_SCORES_AHEAD_MIN_ROW_TILES`, `LEFT_SCORES_AHEAD_MIN_UNIT_TILES`).

    >>> left_scores_ahead(2, False), left_scores_ahead(4, False), left_scores_ahead(4, True)
    (False, True, False)
    >>> left_scores_ahead(4, False, unit_tiles_hint=16), left_scores_ahead(4, False, unit_tiles_hint=64)
    (False, True)
    """
    long_units = unit_tiles_hint is None or unit_tiles_hint >= LEFT_SCORES_AHEAD_MIN_UNIT_TILES
    return not fp8 and row_tiles >= LEFT_SCORES_AHEAD_MIN_ROW_TILES and long_units


def rows_are_contiguous(pages: torch.Tensor) -> bool:
    """Whether `[num_pages, page_size, dim]` pages are one `[rows, dim]` matrix (what TMA reads)."""
    return pages.stride(2) == 1 and pages.stride(0) == pages.shape[1] * pages.stride(1)


SEESAW = CachedLaunch(mla_decode_hopper_seesaw_kernel, ptx_rewrite=evict_first_tma_loads)
FP8_SPLIT = CachedLaunch(mla_decode_hopper_fp8_kernel)
SPLIT = CachedLaunch(mla_decode_hopper_split_kernel)
