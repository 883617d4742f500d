"""The fused cache-write kernel against LatentStore's torch write (CPU interpreter or GPU)."""

import pytest
import torch

from mlakit.cache import LatentStore, PagedLatentCache
from mlakit.kernels.cache_write import write_rows
from mlakit.cache.kv_quant import dequantize
from mlakit.errors import MLAInputError
from host_sync import forbidding_host_syncs


@pytest.mark.parametrize("dtype, layout, dim", [("bf16", "tensor", 576), ("fp16", "tensor", 80), ("fp32", "tensor", 288),
                                                ("fp8_e4m3", "tensor", 576), ("fp8_e4m3", "group", 576),
                                                ("fp8_e4m3", "group", 80)])
def test_kernel_write_matches_the_torch_write_and_skips_padding(dtype, layout, dim, kernel_device):
    gen = torch.Generator().manual_seed(dim)
    fp8_scale = 0.25 if (dtype, layout) == ("fp8_e4m3", "tensor") else None
    expected = LatentStore(6, 4, dim, dtype=dtype, scale_layout=layout, fp8_scale=fp8_scale)
    got = LatentStore(6, 4, dim, dtype=dtype, scale_layout=layout, fp8_scale=fp8_scale, device=kernel_device)
    for store in (expected, got):  # garbage everywhere first: untouched slots must keep it
        store.data.copy_(torch.randn(store.data.shape, generator=torch.Generator().manual_seed(1)).to(store.data.dtype))
    slots = torch.tensor([5, -1, 0, 23, 12, -1, 7])
    rows = torch.randn(len(slots), dim, generator=gen) * 3
    rows[2, :8] *= 1000  # saturates a per-tensor scale, stretches a group scale
    expected.write_slots(slots[slots >= 0], rows[slots >= 0])
    write_rows(got.data, got.scale, slots.to(kernel_device), rows.to(kernel_device), got.fp8_counts)
    untouched = torch.ones(24, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    got_flat, expected_flat = got.data.cpu().view(24, dim), expected.data.view(24, dim)
    assert torch.equal(got_flat[untouched].float(), expected_flat[untouched].float()), "padding or other slots changed"
    got_values = dequantize(got.data.cpu(), None if got.scale is None else got.scale.cpu()).view(24, dim)[~untouched]
    expected_values = dequantize(expected.data, expected.scale).view(24, dim)[~untouched]
    if kernel_device == "cuda":
        assert torch.equal(got_values, expected_values)
    else:
        # The interpreter truncates fp32 -> 16-bit casts instead of rounding: allow one step of the format.
        # (fp8 values are pre-rounded to the e4m3 grid in the kernel under the interpreter, so they are exact.)
        step = {"bf16": 2**-7, "fp16": 2**-10, "fp32": 0.0, "fp8_e4m3": 0.0}[dtype]
        assert ((got_values - expected_values).abs() <= step * expected_values.abs()).all()
    if layout == "group":
        assert torch.equal(got.scale.cpu(), expected.scale)


@pytest.mark.parametrize("dtype, layout", [("bf16", "tensor"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "group")])
def test_kernel_write_reads_column_strided_rows(dtype, layout, kernel_device):
    """Rows that are a transposed view (column stride != 1) are stored as their values, not their memory order."""
    fp8_scale = 0.25 if (dtype, layout) == ("fp8_e4m3", "tensor") else None
    expected = LatentStore(4, 4, 80, dtype=dtype, scale_layout=layout, fp8_scale=fp8_scale)
    got = LatentStore(4, 4, 80, dtype=dtype, scale_layout=layout, fp8_scale=fp8_scale, device=kernel_device)
    columns = torch.randn(80, 5, generator=torch.Generator().manual_seed(3)) * 3
    slots = torch.tensor([9, 0, -1, 15, 4])
    expected.write_slots(slots, columns.t().contiguous())
    write_rows(got.data, got.scale, slots.to(kernel_device), columns.to(kernel_device).t(), got.fp8_counts)
    got_values = dequantize(got.data.cpu(), None if got.scale is None else got.scale.cpu())
    step = {"bf16": 2**-7, "fp8_e4m3": 0.0}[dtype]  # the interpreter truncates fp32 -> bf16 (see above)
    assert ((got_values - expected.dequantized()).abs() <= step * expected.dequantized().abs()).all()


@pytest.mark.parametrize("device", ["cpu", "kernel"])
@pytest.mark.parametrize(
    "slots, rows, message",
    [
        (torch.tensor([0, 1]), torch.randn(2, 10), r"rows: expected a floating-point tensor \[n, 8\] .*shape \(2, 10\)"),
        (torch.tensor([0, 1]), torch.randn(8), r"rows: expected a floating-point tensor \[n, 8\]"),
        (torch.tensor([0, 1]), torch.ones(2, 8, dtype=torch.int32), r"rows: expected a floating-point tensor .*torch\.int32"),
        (torch.tensor([0]), torch.randn(2, 8), r"slots: expected an int32 or int64 tensor \[2\] .*shape \(1,\)"),
        (torch.tensor([0.0, 1.0]), torch.randn(2, 8), r"slots: expected an int32 or int64 tensor \[2\] .*torch\.float32"),
        ([0, 1], torch.randn(2, 8), r"slots: expected an int32 or int64 tensor \[2\] .*got list"),
    ],
)
def test_write_slots_refuses_rows_and_slots_that_do_not_fit_naming_them(device, slots, rows, message, kernel_device):
    """Before: a wider row was cut silently on the GPU path and too few slots read past the slot tensor."""
    store = LatentStore(2, 4, 8, dtype="bf16", device=kernel_device if device == "kernel" else "cpu")
    moved = [t.to(store.data.device) if isinstance(t, torch.Tensor) else t for t in (slots, rows)]
    before = store.data.clone()
    with pytest.raises(MLAInputError, match=message):
        store.write_slots(*moved)
    assert torch.equal(store.data, before)


STORES = [("bf16", "tensor", None), ("fp8_e4m3", "tensor", 0.25), ("fp8_e4m3", "tensor", "auto"),
          ("fp8_e4m3", "group", None)]


def _store(dtype, layout, fp8_scale, device, seed):
    """A [2 pages x 16, 80] store (32 slots) holding random rows everywhere, so untouched slots can be told apart."""
    store = LatentStore(2, 16, 80, dtype=dtype, scale_layout=layout, fp8_scale=fp8_scale, device=device)
    store.data.copy_(torch.randn(store.data.shape, generator=torch.Generator().manual_seed(seed)).to(store.data.dtype))
    return store


def _state(store):
    """The store's bytes, scales and fp8 counts, copied to the host."""
    return [None if t is None else t.detach().cpu().clone() for t in (store.data.view(torch.uint8) if store.is_fp8
            else store.data, store.scale, store.fp8_counts)]


def _same_state(a, b):
    return all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))


def _rows_that_count(n, seed):
    """Random rows whose first holds a saturating and a non-finite value, so an fp8 write of it changes the counts."""
    rows = torch.randn(n, 80, generator=torch.Generator().manual_seed(seed)) * 3
    rows[0, :2] = torch.tensor([1e6, float("inf")])
    return rows


@pytest.mark.parametrize("device", ["cpu", "kernel"])
@pytest.mark.parametrize("dtype, layout, fp8_scale", STORES)
@pytest.mark.parametrize("bad, at", [(40, 1), (32, 2), (-2, 1), (-7, 2)])
def test_write_slots_refuses_slots_outside_the_cache_with_nothing_written_or_counted(
        device, dtype, layout, fp8_scale, bad, at, kernel_device):
    """Before: an out-of-range slot wrote past the cache on the GPU, raised a bare IndexError after the fp8 counts
    moved on the CPU, and -2 was dropped like padding."""
    store = _store(dtype, layout, fp8_scale, kernel_device if device == "kernel" else "cpu", seed=bad + 100)
    slots = torch.tensor([3, -1, 17])
    slots[at] = bad
    before = _state(store)
    with pytest.raises(MLAInputError, match=rf"slots: expected -1 \(padding\) or a flat slot in \[0, 32\), "
                                            rf"got slots\[{at}\] = {bad}$"):
        store.write_slots(slots.to(store.data.device), _rows_that_count(3, seed=bad + 200).to(store.data.device))
    assert _same_state(_state(store), before)
    if store._auto_undecided is not None:
        assert store.awaiting_auto_scale


def test_paged_cache_write_slots_checks_slot_values_and_passes_the_opt_out_on():
    cache = PagedLatentCache(2, 16, 64, 16)
    rows = torch.randn(2, 80, generator=torch.Generator().manual_seed(7))
    with pytest.raises(MLAInputError, match=r"got slots\[0\] = 32$"):
        cache.write_slots(torch.tensor([32, 0]), rows)
    assert not cache.data.any()
    cache.write_slots(torch.tensor([32, 0]), rows, check_values=False)
    assert torch.equal(cache.data.view(32, 80)[0], rows[1].bfloat16()) and not cache.data.view(32, 80)[1:].any()


@pytest.mark.parametrize("device", ["cpu", "kernel"])
@pytest.mark.parametrize("dtype, layout, fp8_scale", STORES)
def test_unchecked_write_skips_slots_outside_the_cache_and_writes_the_rest(device, dtype, layout, fp8_scale,
                                                                           kernel_device):
    """check_values=False (slots from reserve(), per step) does what a checked write of the in-range rows alone
    does on the same device."""
    where = kernel_device if device == "kernel" else "cpu"
    store, expected = _store(dtype, layout, fp8_scale, where, seed=1), _store(dtype, layout, fp8_scale, where, seed=1)
    slots = torch.tensor([40, 5, -1, -2, 31, 32], device=where)
    rows = torch.randn(6, 80, generator=torch.Generator().manual_seed(2)).to(where) * 3
    rows[[0, 3, 5], :2] = torch.tensor([1e6, float("inf")], device=where)  # the skipped rows would move the fp8 counts
    inside = (slots >= 0) & (slots < 32)
    store.write_slots(slots, rows, check_values=False)
    expected.write_slots(slots[inside], rows[inside])
    got = _state(store)
    assert _same_state(got, _state(expected))
    assert not _same_state(got, _state(_store(dtype, layout, fp8_scale, "cpu", seed=1))), "the in-range rows landed"
    if store.is_fp8:
        assert store.fp8_counts.tolist() == [0, 0]


@pytest.mark.parametrize("dtype, layout", [("bf16", "tensor"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "group")])
def test_kernel_write_never_writes_outside_its_data(dtype, layout, kernel_device):
    """The kernel on the first two pages of a bigger tensor: slots past them (and below -1) leave the third page, its
    scales and the counts alone; the slot inside is written. Before: slot 40 landed in the third page."""
    gen = torch.Generator().manual_seed(11)
    storage = torch.bfloat16 if dtype == "bf16" else torch.float8_e4m3fn
    big = torch.randn(3, 16, 80, generator=gen).to(storage).to(kernel_device)
    big_scale = None
    if dtype == "fp8_e4m3":
        big_scale = torch.full((1,), 0.25) if layout == "tensor" else torch.rand(3, 16, 1, generator=gen) + 0.5
        big_scale = big_scale.to(kernel_device)
    counts = torch.zeros(2, dtype=torch.int64, device=kernel_device)
    before = big.cpu().view(torch.uint8).clone(), None if big_scale is None else big_scale.cpu().clone()
    slots = torch.tensor([40, 7, 32, -2, 47])
    rows = torch.randn(5, 80, generator=gen) * 3
    rows[[0, 2, 3, 4], :2] = torch.tensor([1e6, float("inf")])
    scale = big_scale[:2] if layout == "group" else big_scale
    write_rows(big[:2], scale, slots.to(kernel_device), rows.to(kernel_device), counts)
    after = big.cpu().view(torch.uint8)
    assert torch.equal(after[2], before[0][2]), "the tensor past the data changed"
    changed = (after.view(48, -1) != before[0].view(48, -1)).any(1).nonzero().flatten().tolist()
    assert changed == [7], f"rows changed at flat slots {changed}, expected only slot 7"
    if layout == "group":
        assert torch.equal(big_scale.cpu()[2], before[1][2])
    assert counts.tolist() == [0, 0]


@pytest.mark.gpu
def test_cuda_checked_write_is_refused_under_capture_and_the_unchecked_one_does_not_sync():
    store = LatentStore(2, 16, 80, dtype="fp8_e4m3", scale_layout="group", device="cuda")
    slots = torch.tensor([3, 40, -1], device="cuda")
    rows = torch.randn(3, 80, generator=torch.Generator().manual_seed(5)).cuda()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(MLAInputError, match="check_values: expected False while a CUDA graph is being captured"):
        with torch.cuda.graph(graph):
            store.write_slots(slots, rows)
    before = _state(store)
    with forbidding_host_syncs():
        store.write_slots(slots, rows, check_values=False)
    reference = LatentStore(2, 16, 80, dtype="fp8_e4m3", scale_layout="group", device="cuda")
    reference.write_slots(torch.tensor([3], device="cuda"), rows[:1])
    assert _same_state(_state(store), _state(reference)) and not _same_state(_state(store), before)
