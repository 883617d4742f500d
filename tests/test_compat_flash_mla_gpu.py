"""mlakit.compat.flash_mla on a GPU (the triton backend) against the oracle, without host syncs
and in CUDA graphs; and, where the real `flash_mla` package imports on an SM90 GPU (built with
scripts/build_flashmla.py, its output on PYTHONPATH), side by side with it on FlashMLA's own
shapes, plus the `flashmla` backend adapter through `mlakit.mla_decode` on the backend grid."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import pytest
import torch

import mlakit
from flash_mla_oracle import LENGTHS, assert_matches_oracle, run
from mlakit.compat.flash_mla import flash_mla_with_kvcache, get_mla_metadata
from mlakit.serving.graphs import capture_graph
from paged_inputs import PagedBatch, assert_lse_close, make_paged_batch, relative_error

pytestmark = pytest.mark.gpu

DecodeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def batch_on_gpu(lengths: list[int], **kwargs: object) -> PagedBatch:
    defaults = dict(page_size=64, kv_lora_rank=512, rope_dim=64, device="cuda")
    return make_paged_batch(lengths, **{**defaults, **kwargs})


def another_layer(batch: PagedBatch) -> PagedBatch:
    """The next layer of the same step: the same pages and lengths, fresh queries and cache rows."""
    kv = batch.kv_cache
    fresh = torch.where(torch.isnan(kv), kv, torch.randn(kv.shape, device=kv.device).to(kv.dtype))
    return dataclasses.replace(batch, q=torch.randn_like(batch.q), kv_cache=fresh)


def layers_of(batch: PagedBatch, count: int) -> list[PagedBatch]:
    layers = [batch]
    while len(layers) < count:
        layers.append(another_layer(layers[-1]))
    return layers


def assert_same(expected_out: torch.Tensor, expected_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Two implementations agree (FlashMLA's conventions: +inf lse where a query sees no key)."""
    assert out.shape == expected_out.shape and out.dtype == expected_out.dtype
    assert lse.shape == expected_lse.shape and lse.dtype == expected_lse.dtype
    assert torch.equal(torch.isposinf(lse), torch.isposinf(expected_lse)), "lse: +inf positions differ"
    assert relative_error(out, expected_out) < 1e-2
    finite = torch.isfinite(expected_lse)
    assert_lse_close(lse[finite], expected_lse[finite], atol=1e-3)


@pytest.mark.parametrize("heads, s_q", [(h, s) for h in (1, 5, 16, 64, 128) for s in (1, 2, 4, 8) if h * s <= 512])
@pytest.mark.parametrize("causal", [True, False])
def test_heads_and_query_lengths(heads, s_q, causal):
    batch = batch_on_gpu([1000, *LENGTHS], heads=heads, q_len=s_q, seed=heads * 10 + s_q)
    assert_matches_oracle(batch, *run(batch, causal=causal), causal=causal)


@pytest.mark.parametrize("page_size, kv_dtype, layout", [
    *[(p, "bf16", "tensor") for p in (1, 16, 32, 128)],
    (64, "fp16", "tensor"), (64, "fp8_e4m3", "tensor"), (64, "fp8_e4m3", "group"), (16, "fp8_e4m3", "tensor"),
])
def test_page_sizes_and_cache_dtypes(page_size, kv_dtype, layout):
    batch = batch_on_gpu(
        [777, 0, 1, 2049], heads=16, q_len=2, page_size=page_size, kv_dtype=kv_dtype, scale_layout=layout,
        q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16,
    )
    assert_matches_oracle(batch, *run(batch, causal=True), causal=True)


def test_no_host_sync_when_filling_or_reusing_a_schedule():
    layers = layers_of(batch_on_gpu([300, 0, 65], heads=16, q_len=2), 3)
    run(layers[0], causal=True)  # compile first: the first launch of a kernel may sync
    torch.cuda.synchronize()
    schedule = get_mla_metadata()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [run(batch, schedule, causal=True) for batch in layers]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for batch, result in zip(layers, results):
        assert_matches_oracle(batch, *result, causal=True)


def graph_step(decode: DecodeFn, make_schedule: Callable[[], tuple], layers: list[PagedBatch], causal: bool) -> list[torch.Tensor]:
    """One step as an engine captures it: a new schedule, then every layer's call sharing it."""
    schedule = make_schedule()
    results = [decode(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 512, *schedule, softmax_scale=b.softmax_scale,
                      causal=causal) for b in layers]
    return [tensor for result in results for tensor in result]


def assert_graph_replays_match_eager(decode: DecodeFn, make_schedule: Callable[[], tuple], causal: bool) -> None:
    """Capture once, shorten the lengths in place, replay: equal to an eager step on the new lengths."""
    layers = layers_of(batch_on_gpu([700, 64, 0, 129], heads=64, q_len=2), 2)
    # one warm-up (on a side stream) compiles outside the capture
    graph, captured = capture_graph(lambda: graph_step(decode, make_schedule, layers, causal), warmup=1)
    layers[0].cache_seqlens.copy_(torch.tensor([640, 0, 0, 65], dtype=torch.int32))  # within each sequence's pages
    graph.replay()
    eager = graph_step(decode, make_schedule, layers, causal)
    for out, lse, eager_out, eager_lse in zip(captured[0::2], captured[1::2], eager[0::2], eager[1::2]):
        assert_same(eager_out, eager_lse, out, lse)
    for batch, out, lse in zip(layers, captured[0::2], captured[1::2]):
        assert_matches_oracle(batch, out, lse, causal=causal)
    del graph


@pytest.mark.parametrize("causal", [True, False])
def test_cuda_graph_with_the_schedule_made_inside_the_step(causal):
    assert_graph_replays_match_eager(flash_mla_with_kvcache, get_mla_metadata, causal)


# --- Side by side with the real FlashMLA (skipped where it is not built). ---


@pytest.fixture(scope="module")
def flash_mla():
    try:
        import flash_mla as module
    except ImportError as error:
        pytest.skip(f"flash_mla is not importable ({error}); build it with scripts/build_flashmla.py and put its output on PYTHONPATH")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FlashMLA's dense decode runs on SM90 only")
    return module


def real_and_compat(flash_mla, batch: PagedBatch, causal: bool, layers: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """(real out, real lse, compat out, compat lse) per layer, each library's schedule shared by its layers."""
    real_schedule, compat_schedule = flash_mla.get_mla_metadata(), get_mla_metadata()
    results = []
    for layer in layers_of(batch, layers):
        args = (layer.q, layer.kv_cache.unsqueeze(2), layer.block_table, layer.cache_seqlens, 512)
        real = flash_mla.flash_mla_with_kvcache(*args, *real_schedule, causal=causal)
        ours = flash_mla_with_kvcache(*args, *compat_schedule, causal=causal)
        results.append((*real, *ours))
    return results


FLASHMLA_GRID = list(itertools.product([16, 64, 128], [1, 2], [True, False], [torch.bfloat16, torch.float16]))


@pytest.mark.parametrize("heads, s_q, causal, dtype", FLASHMLA_GRID)
def test_compat_equals_flash_mla_on_its_own_shapes(flash_mla, heads, s_q, causal, dtype):
    lengths = [4096, 0, 140, 20, 2, 0, 2049, 64, 65, 3000]  # FlashMLA's tests keep lengths >= s_q or 0
    kv_dtype = "fp16" if dtype == torch.float16 else "bf16"
    batch = batch_on_gpu(lengths, heads=heads, q_len=s_q, kv_dtype=kv_dtype, q_dtype=dtype, seed=heads + s_q)
    for result in real_and_compat(flash_mla, batch, causal, layers=3):
        assert_same(*result)


@pytest.mark.parametrize("causal", [True, False])
def test_compat_equals_flash_mla_in_cuda_graphs(flash_mla, causal):
    # One library's graph at a time: interleaving two libraries' graphs in one process crashed before (TOOLING.md).
    assert_graph_replays_match_eager(flash_mla.flash_mla_with_kvcache, flash_mla.get_mla_metadata, causal)
    assert_graph_replays_match_eager(flash_mla_with_kvcache, get_mla_metadata, causal)


ADAPTER_GRID = [(h, q) for h in (1, 5, 16, 20, 40, 64, 128) for q in (1, 2, 4)]


@pytest.mark.parametrize("heads, q_len", ADAPTER_GRID)
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16"])
def test_flashmla_backend_through_mla_decode(flash_mla, heads, q_len, kv_dtype):
    batch = batch_on_gpu([1000, 0, 5, 257, 64], heads=heads, q_len=q_len, kv_dtype=kv_dtype,
                         q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16, seed=heads * 10 + q_len)
    expected = mlakit.reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=512,
                                       softmax_scale=batch.softmax_scale)
    metadata = mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=q_len, heads=heads, backend="flashmla", kv_cache_dtype=kv_dtype)
    for layer_metadata in (None, metadata, metadata):
        out, lse = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, softmax_scale=batch.softmax_scale,
                                     backend="flashmla", metadata=layer_metadata)
        assert relative_error(out, expected[0]) < 1e-2
        assert_lse_close(lse, expected[1], atol=1e-3)


def test_auto_prefers_flashmla_where_it_is_installed(flash_mla):
    batch = batch_on_gpu([100], heads=16)
    name = mlakit.resolve(mlakit.ServingConfig(), mlakit.MLAShape.preset("deepseek-v3")).decode_backend
    assert name == "flashmla", name
    out, _ = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, softmax_scale=batch.softmax_scale)
    assert out.shape == (1, 1, 16, 512)
