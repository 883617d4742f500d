"""TMA descriptors of the seesaw's cache reads (host side): the latent columns half a tile a copy and the rope
blocks, kept per pages' layout."""
from __future__ import annotations

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.kernels.hopper_common import BLOCK_N, TensorAddress, remember, row_descriptors
from mlakit.kernels.hopper_decode.constants import TMA_CHUNK


def chunk_descriptors(pages: torch.Tensor, kv_lora_rank: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of the cache rows `[pages x page_size, dim]` (row-contiguous pages: `rows_are_contiguous`):
    the latent columns half a tile a copy (`half_tile_descriptor`) and `[BLOCK_N, rope_dim]` rope blocks, kept by the
    pages' address, shape, strides and dtype (one lookup a call)."""
    key = (pages.data_ptr(), pages.shape, pages.stride(), pages.dtype, kv_lora_rank)
    found = _CHUNK_DESCRIPTORS.get(key)
    if found is None:
        rope_dim = pages.shape[-1] - kv_lora_rank
        found = remember(_CHUNK_DESCRIPTORS, key, (half_tile_descriptor(pages, kv_lora_rank),
                                                   row_descriptors(pages, ((BLOCK_N.value, rope_dim),))[0]))
    return found


_CHUNK_DESCRIPTORS: dict[tuple, tuple[TensorDescriptor, TensorDescriptor]] = {}


def half_tile_descriptor(pages: torch.Tensor, kv_lora_rank: int) -> TensorDescriptor:
    """The latent columns of the cache rows seen as `[chunks, rows, TMA_CHUNK]` (a chunk's stride is TMA_CHUNK
    elements, a row's the row stride), read in `[chunks / 2, BLOCK_N, TMA_CHUNK]` boxes: one TMA copy lands half a
    tile as the chunk-major blocks the swizzled stage buffer holds (NOTES.md v70). fp8 pages, whose chunks land in
    the first half of their 16-bit blocks (`_fp8_block`), get a size-one dimension before the rows, read two deep:
    TMA fills each block's second half with zeros, which costs no reads (NOTES.md v71)."""
    if kv_lora_rank % (2 * TMA_CHUNK.value):
        raise ValueError(f"kv_lora_rank: expected a multiple of {2 * TMA_CHUNK.value} (whole tile halves), got "
                         f"{kv_lora_rank}")
    rows = pages.reshape(-1, pages.shape[-1])
    chunks = kv_lora_rank // TMA_CHUNK.value
    shape, strides = [chunks, rows.shape[0], TMA_CHUNK.value], [TMA_CHUNK.value, rows.stride(0), 1]
    box = [chunks // 2, BLOCK_N.value, TMA_CHUNK.value]
    swizzle = 128
    if pages.dtype == FP8_DTYPE:
        shape.insert(1, 1)
        strides.insert(1, 16)
        box.insert(1, 2)
        swizzle = 64
    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=rows.element_size() * 8, rank=len(shape))
    return TensorDescriptor(TensorAddress(rows.data_ptr(), rows.dtype), shape, strides, box, layout)
