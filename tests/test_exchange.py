"""`exchange_partials`' packing: what a rank receives is exactly what was sent for its head block,
for widths and dtypes whose rows need padding to 16 bytes (one process over gloo: the group of
one sends everything to itself; tests/test_distributed_dcp.py runs worlds of 2 and 4). Below it,
`gather_heads`, `exchange_partials` and `merge_across_ranks` in worlds of 1-4 ranks run as threads
of this process, where mutmut can see them (TESTING.md, "Mutation check")."""

from __future__ import annotations

import math
import os
import threading

import pytest
import torch
import torch.distributed as dist

from mlakit.distributed import collectives, exchange_partials, gather_heads, merge_across_ranks
from mlakit.errors import MLAInputError
from mlakit.reference import merge_attention_states


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


# --- Worlds of several ranks in one process (what mutmut can see: its per-test stats miss the gloo ranks of
# tests/test_distributed_dcp.py, which run in child processes). Each rank is a thread; the two collectives are
# replaced by exchanges between the threads with torch.distributed's semantics.


class _ThreadedGroup:
    """A process group of `size` ranks emulated by threads: `run(fn)` calls `fn(rank)` on one thread per
    rank and returns the results in rank order; `all_gather` / `all_to_all` see every rank's tensor."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=60)
        self._tensors: list[torch.Tensor | None] = [None] * size
        self._local = threading.local()

    def run(self, fn):
        results, errors = [None] * self.size, []

        def body(rank: int) -> None:
            self._local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after every thread ended
                errors.append(exc)
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        return results

    def _everyones(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if not (tensor.is_contiguous()):
            raise ValueError("Tensors must be contiguous")  # as gloo's and NCCL's collectives
        self._tensors[self._local.rank] = tensor.clone()
        self._barrier.wait()
        everyones = list(self._tensors)
        self._barrier.wait()
        return everyones

    def all_gather(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        """torch.distributed.all_gather_into_tensor: rank r's tensor at rows r * n .. (r + 1) * n - 1."""
        everyones = self._everyones(tensor)
        assert output.is_contiguous() and output.shape == (self.size * tensor.shape[0], *tensor.shape[1:])
        output.copy_(torch.cat(everyones))

    def all_to_all(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        """torch.distributed.all_to_all_single with equal splits: chunk j of rank r's tensor is chunk r of
        rank j's output."""
        everyones = self._everyones(tensor)
        assert output.is_contiguous() and output.shape == tensor.shape and output.dtype == tensor.dtype
        rank = self._local.rank
        output.copy_(torch.cat([t.chunk(self.size)[rank] for t in everyones]))


@pytest.fixture
def threaded_world(monkeypatch):
    """`make(size)`: a `_ThreadedGroup` that `gather_heads`, `exchange_partials` and `merge_across_ranks`
    accept as their group; any other group goes to torch.distributed itself."""
    real_size, real_gather, real_all_to_all = dist.get_world_size, collectives._all_gather_single, dist.all_to_all_single
    groups: list[_ThreadedGroup] = []

    def get_world_size(group=None):
        return group.size if group in groups else real_size(group)

    def all_gather(output, tensor, group=None, **kwargs):
        if group not in groups:
            return real_gather(output, tensor, group=group, **kwargs)
        return group.all_gather(output, tensor)

    def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None, **kwargs):
        if group not in groups or output_split_sizes is not None or input_split_sizes is not None:
            return real_all_to_all(output, tensor, output_split_sizes, input_split_sizes, group=group, **kwargs)
        return group.all_to_all(output, tensor)

    monkeypatch.setattr(dist, "get_world_size", get_world_size)
    monkeypatch.setattr(collectives, "_all_gather_single", all_gather)
    monkeypatch.setattr(dist, "all_to_all_single", all_to_all_single)

    def make(size: int) -> _ThreadedGroup:
        groups.append(_ThreadedGroup(size))
        return groups[-1]

    return make


def _partials(size: int, lead: tuple[int, ...], heads_per_rank: int, dim: int, dtype: torch.dtype, seed: int):
    """Every rank's partial (out, lse) over the group's heads: random, a third of the parts empty (lse
    -inf, their rows still random), and query 0 (without leading axes: each block's first head) seen by no rank."""
    gen = torch.Generator().manual_seed(seed)
    heads = size * heads_per_rank
    out = (torch.randn(size, *lead, heads, dim, generator=gen) * 2).to(dtype)
    lse = torch.randn(size, *lead, heads, generator=gen) * 3
    lse[torch.rand(lse.shape, generator=gen) < 0.3] = float("-inf")
    if lead:
        lse[:, 0] = float("-inf")
    else:
        lse[:, ::heads_per_rank] = float("-inf")
    return out, lse


def _folded(parts: list[torch.Tensor], part_lse: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = parts[0].float(), part_lse[0]
    for part, part_l in zip(parts[1:], part_lse[1:]):
        out, lse = merge_attention_states(out, lse, part.float(), part_l)
    return out, lse


LEADS = [(), (3,), (2, 5)]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("lead", LEADS)
def test_gather_heads_puts_rank_js_heads_at_block_j(threaded_world, size, lead):
    group, heads, dim = threaded_world(size), 3, 24
    full = torch.randn(*lead, size * heads, dim, generator=torch.Generator().manual_seed(size + 10 * len(lead)))
    full = full.bfloat16()
    mine = [full[..., r * heads:(r + 1) * heads, :] for r in range(size)]  # not contiguous where lead != ()
    for gathered in group.run(lambda rank: gather_heads(mine[rank], group)):
        assert gathered.shape == full.shape and gathered.dtype == full.dtype and torch.equal(gathered, full)


def test_gather_heads_refuses_a_tensor_without_a_head_axis(world_of_one):
    with pytest.raises(MLAInputError, match=r"^x: expected a tensor \[\.\.\., heads, dim\], got shape \(8,\)$"):
        gather_heads(torch.randn(8), world_of_one)


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize(("dim", "dtype"), [(7, torch.bfloat16), (40, torch.float16), (5, torch.float32)])
def test_exchange_sends_head_block_j_to_rank_j_in_aligned_rows(threaded_world, size, lead, dim, dtype):
    group, per_rank = threaded_world(size), 3
    out, lse = _partials(size, lead, per_rank, dim, dtype, seed=size * 100 + dim + len(lead))
    received = group.run(lambda rank: exchange_partials(out[rank], lse[rank], group))
    row_bytes = -(-dim * dtype.itemsize // 16) * 16  # the narrowest 16-byte multiple holding a row
    for rank, (parts, part_lse) in enumerate(received):
        block = slice(rank * per_rank, (rank + 1) * per_rank)
        assert parts.shape == (size, *lead, per_rank, dim) and parts.dtype == dtype
        assert part_lse.shape == (size, *lead, per_rank) and part_lse.dtype == torch.float32
        for sender in range(size):
            assert torch.equal(parts[sender], out[sender][..., block, :])
            assert torch.equal(part_lse[sender], lse[sender][..., block])
            assert parts[sender].data_ptr() % 16 == 0 and part_lse[sender].data_ptr() % 16 == 0
        assert parts.stride(-2) * dtype.itemsize == row_bytes
        # the lse right after the rows, padded to 16 bytes: each sender's chunk as small as that allows
        rows = per_rank * math.prod(lead)
        assert part_lse.data_ptr() - parts.data_ptr() == rows * row_bytes
        assert parts.stride(0) * dtype.itemsize == rows * row_bytes + -(-rows * 4 // 16) * 16


def test_exchange_refuses_heads_not_divisible_by_the_group(threaded_world):
    group = threaded_world(4)
    with pytest.raises(MLAInputError, match=r"^out: expected a head count divisible by the group's 4 ranks, got 6 heads$"):
        exchange_partials(torch.randn(2, 6, 8), torch.randn(2, 6), group)


class _ClaimsCuda(torch.Tensor):
    """A CPU tensor that says it is on a GPU: sends merge_across_ranks down its Triton path (the interpreter)."""

    @property
    def is_cuda(self) -> bool:
        return True


@pytest.mark.parametrize("path", ["torch", "triton"])
@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merge_across_ranks_equals_the_folded_reference(threaded_world, monkeypatch, path, size, lead, dtype):
    if path == "triton":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("CPU tensors posing as CUDA ones need Triton's interpreter (on GPUs the multi-GPU tests run this path)")
        rank_merge = pytest.importorskip("mlakit.kernels.rank_merge")
        exchange, merge, interpreter = collectives.exchange_partials, rank_merge.merge_partials, threading.Lock()

        def merge_partials(*args):
            with interpreter:  # Triton's interpreter runs one kernel at a time
                return merge(*args)

        monkeypatch.setattr(collectives, "exchange_partials",
                            lambda *args: tuple(t.as_subclass(_ClaimsCuda) for t in exchange(*args)))
        monkeypatch.setattr(rank_merge, "merge_partials", merge_partials)
    group, per_rank, dim = threaded_world(size), 2, 24
    out, lse = _partials(size, lead, per_rank, dim, dtype, seed=size * 7 + len(lead))
    merged = group.run(lambda rank: merge_across_ranks(out[rank], lse[rank], group))
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    for rank, (merged_out, merged_lse) in enumerate(merged):
        block = slice(rank * per_rank, (rank + 1) * per_rank)
        want_out, want_lse = _folded([o[..., block, :] for o in out], [l[..., block] for l in lse])
        assert type(merged_out) is torch.Tensor and type(merged_lse) is torch.Tensor
        assert merged_out.dtype == dtype and merged_lse.dtype == torch.float32
        assert merged_out.shape == (*lead, per_rank, dim) and merged_lse.shape == (*lead, per_rank)
        torch.testing.assert_close(merged_out.float(), want_out.to(dtype).float(), atol=tol, rtol=tol)
        torch.testing.assert_close(merged_lse, want_lse, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(want_lse).any()
        assert torch.equal(merged_out[0].float(), torch.zeros(merged_out[0].shape))  # query 0 / head 0: no rank's key
        assert (merged_lse[0] == float("-inf")).all()


def test_exchange_buffers_ignore_the_default_device_and_dtype(world_of_one):
    """float32 exchange buffers on the inputs' device, whatever torch's defaults (an engine may call
    `torch.set_default_device("cuda")` or another default dtype)."""
    gen = torch.Generator().manual_seed(5)
    out, lse = torch.randn(3, 4, 40, generator=gen).bfloat16(), torch.randn(3, 4, generator=gen)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("meta"):
            parts, part_lse = exchange_partials(out, lse, world_of_one)
            merged, merged_lse = merge_across_ranks(out, lse, world_of_one)
    finally:
        torch.set_default_dtype(default)
    assert parts.device.type == part_lse.device.type == "cpu" and part_lse.dtype == torch.float32
    assert torch.equal(parts[0], out) and torch.equal(part_lse[0], lse)
    assert merged.dtype == torch.bfloat16 and merged_lse.dtype == torch.float32
    assert torch.equal(merged, out) and torch.equal(merged_lse, lse)


@pytest.mark.parametrize("shapes, pattern", [
    (dict(kv_b_weight=(2 * 24 + 1, 32)), r"kv_b_weight: expected \[2 heads x \(d_nope 16 \+ d_v\), kv_lora_rank 32\]"),
    (dict(q_pe=(1, 3, 16)), r"q_pe: expected \[1 tokens \(the step's new tokens\), heads, dim\]"),
    (dict(q_nope=(2, 16)), r"q_nope: expected \[1 tokens"),
])
def test_dcp_mla_forward_names_an_operand_that_does_not_fit(world_of_one, shapes, pattern):
    from mlakit.distributed import TokenSharding, dcp_decode_step
    from mlakit.distributed.attention import dcp_mla_forward

    step = dcp_decode_step(TokenSharding(1), 0, torch.tensor([[0]], dtype=torch.int32),
                           torch.tensor([5], dtype=torch.int32), q_len=1, page_size=8)
    generator = torch.Generator().manual_seed(4)
    sizes = dict(q_nope=(1, 2, 16), q_pe=(1, 2, 16), kv_b_weight=(2 * 24, 32)) | shapes
    operands = {name: torch.randn(size, generator=generator) for name, size in sizes.items()}
    with pytest.raises(MLAInputError, match=pattern):
        dcp_mla_forward(operands["q_nope"], operands["q_pe"], torch.randn(1, 8, 48, generator=generator), None,
                        operands["kv_b_weight"], step, world_of_one, softmax_scale=0.2)
