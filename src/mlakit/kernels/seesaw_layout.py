"""Which caches the persistent Hopper decode kernel (the seesaw) reads, in plain ints and without triton, so that a
caller on any machine can give a decode plan its page-size hint (`decode_page_size_hint`); the kernels' own
constants are built from these."""
from __future__ import annotations

import torch

from mlakit.cache.kv_quant import FP8_DTYPE, SCALE_PER_TENSOR, scale_mode
from mlakit.errors import MLAInputError, is_int
from mlakit.reference import pages_view

# Tokens a KV tile of the Hopper kernels (`hopper_common.BLOCK_N`).
KV_TILE_TOKENS = 64
# Latent columns a TMA box of the seesaw (`hopper_decode.constants.TMA_CHUNK`).
LATENT_CHUNK_COLUMNS = 64
# DeepSeek's latent and rope widths: the seesaw takes fp8 pages only at these, and S runs on 8-bit tensor cores
# (`e4m3_scores`) only at these in either Hopper kernel.
DEEPSEEK_WIDTHS = (512, 64)


def seesaw_pages(page_size: int) -> bool:
    """Whether pages of `page_size` tokens hold whole 64-token KV tiles, as the seesaw's TMA loads need (its other
    conditions, on the latent widths and fp8, are `seesaw_takes`'s).

    >>> [seesaw_pages(n) for n in (1, 16, 64, 128)]
    [False, False, True, True]
    """
    return page_size % KV_TILE_TOKENS == 0


def seesaw_takes(page_size: int, kv_lora_rank: int, rope_dim: int, fp8: bool) -> bool:
    """Whether the seesaw kernel serves these pages: whole 64-token tiles per page and at least two latent
    chunks; fp8 only at 512 + 64 (its chunks and rope convert in place as 64-column blocks).

    >>> seesaw_takes(64, 512, 64, True), seesaw_takes(64, 256, 32, True), seesaw_takes(64, 64, 16, False)
    (True, False, False)
    """
    whole_tiles = seesaw_pages(page_size) and kv_lora_rank >= 2 * LATENT_CHUNK_COLUMNS
    return whole_tiles and (not fp8 or (kv_lora_rank, rope_dim) == DEEPSEEK_WIDTHS)


def seesaw_serves(page_size: int, kv_lora_rank: int, rope_dim: int, fp8: bool, kv_scale_mode: int) -> bool:
    """Whether the persistent seesaw kernel reads pages of this layout (on a GPU the Hopper kernels serve), where a
    plan may take equal shares (`decode_split_plan.may_share`): `seesaw_takes`'s pages and widths, fp8 with one
    per-tensor scale (`kv_quant.scale_mode`'s values).

    >>> from mlakit.cache.kv_quant import SCALE_PER_GROUP
    >>> seesaw_serves(64, 512, 64, True, SCALE_PER_TENSOR), seesaw_serves(64, 512, 64, True, SCALE_PER_GROUP)
    (True, False)
    """
    return seesaw_takes(page_size, kv_lora_rank, rope_dim, fp8) and (not fp8 or kv_scale_mode == SCALE_PER_TENSOR)


def layout_page_size_hint(page_size: int, kv_lora_rank: int, rope_dim: int, fp8: bool,
                          kv_scale_mode: int) -> int | None:
    """`decode_page_size_hint` for a cache described by its layout (`seesaw_serves`'s arguments) instead of a tensor,
    for a caller that plans before it sees the cache (the FlashInfer drop-in's `plan()`).

    >>> from mlakit.cache.kv_quant import SCALE_PER_GROUP
    >>> [layout_page_size_hint(128, 512, 64, True, mode) for mode in (SCALE_PER_TENSOR, SCALE_PER_GROUP)]
    [128, None]
    """
    return page_size if seesaw_serves(page_size, kv_lora_rank, rope_dim, fp8, kv_scale_mode) else None


def decode_page_size_hint(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, kv_lora_rank: int) -> int | None:
    """The `page_size` hint for `mla_decode_metadata` / `mla_extend_metadata` (and `plan_decode` / `plan_extend`)
    over this cache and its fp8 scale: its tokens per page where the seesaw reads the cache (`seesaw_serves`), else
    None (the plan then takes no equal shares, which the other kernels run slowly; also None for a tensor that is not
    `[num_pages, page_size, dim]`, which the calls refuse). Reads shapes and dtypes only.

    >>> pages = torch.zeros(2, 64, 576, dtype=FP8_DTYPE)
    >>> decode_page_size_hint(pages, torch.ones(1), 512), decode_page_size_hint(pages, torch.ones(2, 64, 5), 512)
    (64, None)
    """
    if not isinstance(kv_cache, torch.Tensor):
        raise MLAInputError(f"kv_cache: expected a torch.Tensor, got {type(kv_cache).__name__}")
    if not is_int(kv_lora_rank) or kv_lora_rank < 1:
        raise MLAInputError(f"kv_lora_rank: expected an integer >= 1 (the latent's width), got {kv_lora_rank!r}")
    pages = pages_view(kv_cache)
    if pages.dim() != 3:
        return None
    return layout_page_size_hint(pages.shape[1], kv_lora_rank, pages.shape[-1] - kv_lora_rank, pages.dtype == FP8_DTYPE,
                                 scale_mode(pages, kv_scale))
