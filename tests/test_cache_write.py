"""The fused cache-write kernel against LatentStore's torch write (CPU interpreter or GPU)."""

import pytest
import torch

from mlakit.cache import LatentStore
from mlakit.kernels.cache_write import write_rows
from mlakit.cache.kv_quant import dequantize


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


@pytest.mark.gpu
def test_cache_write_replays_from_a_cuda_graph_with_new_slots():
    store = LatentStore(8, 16, 576, dtype="fp8_e4m3", scale_layout="group", device="cuda")
    slots = torch.full((4,), -1, dtype=torch.int64, device="cuda")
    rows = torch.zeros(4, 576, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        store.write_slots(slots, rows)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            store.write_slots(slots, rows)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = LatentStore(8, 16, 576, dtype="fp8_e4m3", scale_layout="group")
    for replay in range(3):
        new_slots = torch.tensor([replay * 4, -1, 100 + replay, 50 - replay])
        new_rows = torch.randn(4, 576)
        slots.copy_(new_slots)
        rows.copy_(new_rows)
        graph.replay()
        expected.write_slots(new_slots, new_rows)
    assert torch.equal(store.data.cpu().view(torch.uint8), expected.data.view(torch.uint8))
    assert torch.equal(store.scale.cpu(), expected.scale)
