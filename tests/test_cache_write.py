"""The fused cache-write kernel against LatentStore's torch write (CPU interpreter or GPU)."""

import pytest
import torch

from mlakit.cache import LatentStore
from mlakit.kernels.cache_write import write_rows
from mlakit.cache.kv_quant import dequantize
from mlakit.errors import MLAInputError


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
