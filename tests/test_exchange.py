"""`exchange_partials`' packing: what a rank receives is exactly what was sent for its head block,
for widths and dtypes whose rows need padding to 16 bytes (one process over gloo: the group of
one sends everything to itself; tests/test_distributed_dcp.py runs worlds of 2 and 4)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from mlakit.distributed import exchange_partials, merge_across_ranks
from mlakit.errors import MLAInputError


@pytest.fixture(scope="module")
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("dim", [7, 40, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("lead", [(3,), (2, 5), ()])
def test_what_is_received_is_what_was_sent(world_of_one, dim, dtype, lead):
    gen = torch.Generator().manual_seed(dim + len(lead))
    out = torch.randn(*lead, 6, dim, generator=gen).to(dtype)
    lse = torch.randn(*lead, 6, generator=gen)
    lse[..., 0] = float("-inf")
    parts, part_lse = exchange_partials(out, lse, world_of_one)
    assert parts.shape == (1, *lead, 6, dim) and parts.dtype == dtype and part_lse.dtype == torch.float32
    assert torch.equal(parts[0], out) and torch.equal(part_lse[0], lse)
    merged, merged_lse = merge_across_ranks(out, lse, world_of_one)
    assert torch.equal(merged, out) and torch.equal(merged_lse, lse)


def test_exchange_refuses_mismatched_lse(world_of_one):
    with pytest.raises(MLAInputError, match=r"out, lse: expected out \[\.\.\., heads, dim\] and lse \[\.\.\., heads\]"):
        exchange_partials(torch.randn(2, 4, 8), torch.randn(2, 3), world_of_one)
