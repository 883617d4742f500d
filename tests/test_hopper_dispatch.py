"""Which pages the Hopper seesaw kernel takes (a host-side rule; the kernels themselves are GPU tests)."""

import pytest

from mlakit.kernels import hopper_decode


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
    assert hopper_decode._seesaw_takes(page_size, kv_lora_rank, rope_dim, fp8) == seesaw
