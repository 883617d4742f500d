"""Which pages the Hopper seesaw kernel takes and how its TMA descriptors cut them (host-side rules; the kernels
themselves are GPU tests)."""

import math

import pytest
import torch

from mlakit.kernels import hopper_decode
from mlakit.kernels.seesaw_layout import seesaw_takes


@pytest.mark.parametrize(
    "page_size, kv_lora_rank, rope_dim, fp8, seesaw",
    [
        (64, 512, 64, False, True), (128, 256, 32, False, True), (256, 128, 16, False, True),
        (32, 512, 64, False, False), (64, 64, 16, False, False), (1, 512, 64, False, False),
        (64, 512, 64, True, True), (128, 512, 64, True, True),
        (32, 512, 64, True, False), (64, 256, 32, True, False), (16, 512, 64, True, False),
    ],
)
def test_seesaw_takes_whole_tile_pages_and_fp8_only_at_deepseek_widths(page_size, kv_lora_rank, rope_dim, fp8, seesaw):
    assert seesaw_takes(page_size, kv_lora_rank, rope_dim, fp8) == seesaw


@pytest.mark.parametrize(
    "out_dtype, page_dtype, page_size, expected",
    [
        (torch.bfloat16, torch.bfloat16, 64, torch.bfloat16), (torch.float16, torch.float16, 128, torch.float16),
        (torch.bfloat16, hopper_decode.FP8_DTYPE, 64, torch.bfloat16),
        (torch.float16, hopper_decode.FP8_DTYPE, 64, torch.float32),  # the scale could pass fp16's range
        (torch.bfloat16, torch.bfloat16, 16, torch.float32),  # the cp.async kernel's partials
    ],
)
def test_seesaw_partials_take_the_outputs_dtype_where_it_holds_them(out_dtype, page_dtype, page_size, expected,
                                                                    monkeypatch):
    pages = torch.empty(2, page_size, 576, dtype=page_dtype)
    assert hopper_decode.partial_dtype(out_dtype, pages, 512, 64) == expected
    monkeypatch.setattr(hopper_decode.dispatch, "SEESAW_16BIT_PARTIALS", False)
    assert hopper_decode.partial_dtype(out_dtype, pages, 512, 64) == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, hopper_decode.FP8_DTYPE])
def test_latent_columns_land_half_a_tile_a_copy(dtype):
    """16-bit and fp8 pages at DeepSeek's widths get a half-tile descriptor whose box fills exactly half of a 16-bit
    stage (fp8: each chunk's box followed by a block half TMA fills with zeros), and a rope descriptor of its own."""
    pages = torch.empty(3, 64, 576, dtype=dtype)
    chunks, rope = hopper_decode.chunk_descriptors(pages, 512)
    if dtype == torch.bfloat16:
        assert (chunks.shape, chunks.strides, chunks.block_shape) == ([8, 192, 64], [64, 576, 1], [4, 64, 64])
        assert chunks.layout.swizzle_byte_width == 128
    else:
        assert (chunks.shape, chunks.strides, chunks.block_shape) == ([8, 1, 192, 64], [64, 16, 576, 1],
                                                                      [4, 2, 64, 64])
        assert chunks.layout.swizzle_byte_width == 64
    half_stage_bytes = 64 * 256 * 2
    assert math.prod(chunks.block_shape) * pages.element_size() == half_stage_bytes
    assert list(rope.block_shape) == [64, 64] and chunks.base.data_ptr() == pages.data_ptr()
    assert hopper_decode.chunk_descriptors(pages, 512)[0] is chunks


def test_half_tiles_need_an_even_number_of_chunks():
    with pytest.raises(ValueError, match="kv_lora_rank: expected a multiple of 128"):
        hopper_decode.chunk_descriptors(torch.empty(2, 64, 192 + 32, dtype=torch.bfloat16), 192)
