"""Paged latent cache: allocation, appends across pages, free and reuse, overflow, fp8 storage."""

import pytest
import torch

from mlakit import CacheFullError, ConfigError, MLAInputError, PageAllocator, PagedLatentCache, mla_decode, reference_decode
from mlakit.cache.kv_quant import (
    AUTO_SCALE_HEADROOM,
    FP8_DTYPE,
    FP8_MAX,
    FP8_SATURATION,
    SCALE_NONE,
    SCALE_PER_GROUP,
    SCALE_PER_TENSOR,
    dequantize,
    fp8_scale_from_rows,
    quantize_rows_per_group,
    quantize_rows_per_tensor,
    scale_mode,
)
from paged_inputs import relative_error


def _rows(n, r=32, dr=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, r, generator=gen), torch.randn(n, dr, generator=gen)


def test_allocator_hands_out_and_takes_back_pages():
    alloc = PageAllocator(5)
    first = alloc.allocate(3)
    assert sorted(first) == [0, 1, 2] and alloc.num_free == 2
    alloc.free([first[1]])
    assert alloc.allocate(1) == [first[1]]
    with pytest.raises(CacheFullError, match="need 3, 2 of 5 free"):
        alloc.allocate(3)
    assert alloc.num_free == 2
    for count in (-1, 1.5):
        with pytest.raises(MLAInputError, match=r"count: expected a page count \(an integer >= 0\)"):
            alloc.allocate(count)
    assert alloc.num_free == 2


@pytest.mark.parametrize("index", [2, -1, "0"])
def test_a_layer_outside_the_cache_is_named(index):
    cache = PagedLatentCache(4, 4, 32, 8, num_layers=2)
    with pytest.raises(MLAInputError, match=r"index: expected a layer in \[0, 2\)"):
        cache.layer(index)


def test_append_writes_rows_at_their_slots_across_pages():
    cache = PagedLatentCache(8, 4, 32, 8, dtype="fp16")
    c1, k1 = _rows(6, seed=1)
    c2, k2 = _rows(5, seed=2)
    cache.append(0, c1[:3], k1[:3])
    cache.append(1, c2, k2)
    slots = cache.append(0, c1[3:], k1[3:])
    assert cache.seq_len(0) == 6 and cache.seq_len(1) == 5
    assert len(cache.pages_of(0)) == 2 and len(cache.pages_of(1)) == 2
    assert set(cache.pages_of(0)).isdisjoint(cache.pages_of(1))
    flat = cache.data.view(-1, 40).float()
    expected = torch.cat([c1, k1], dim=1).half().float()
    pages = cache.pages_of(0)
    for t in range(6):
        assert torch.equal(flat[pages[t // 4] * 4 + t % 4], expected[t])
    assert slots.tolist() == [pages[0] * 4 + 3, pages[1] * 4, pages[1] * 4 + 1]
    table = cache.block_table([1, 0, 9])
    assert table.dtype == torch.int32 and table.shape == (3, 2)
    assert table[1].tolist() == pages and cache.seq_lens([1, 0, 9]).tolist() == [5, 6, 0]


def test_free_returns_pages_for_reuse():
    cache = PagedLatentCache(3, 4, 32, 8)
    cache.append(0, *_rows(8))
    freed = cache.pages_of(0)
    cache.free(0)
    assert cache.seq_len(0) == 0 and cache.allocator.num_free == 3
    cache.append(1, *_rows(12))
    assert set(freed) <= set(cache.pages_of(1))


def test_overflow_raises_and_changes_nothing():
    cache = PagedLatentCache(3, 4, 32, 8)
    cache.append(0, *_rows(5, seed=3))
    data_before, pages_before = cache.data.clone(), cache.pages_of(0)
    with pytest.raises(CacheFullError, match="sequence 0 needs 2 more page"):
        cache.append(0, *_rows(8, seed=4))
    with pytest.raises(CacheFullError):
        cache.append(1, *_rows(9, seed=5))
    assert torch.equal(cache.data.view(torch.int16), data_before.view(torch.int16))
    assert cache.pages_of(0) == pages_before and cache.seq_len(0) == 5
    assert cache.seq_len(1) == 0 and cache.allocator.num_free == 1


def test_bad_writes_are_named():
    cache = PagedLatentCache(2, 4, 32, 8)
    with pytest.raises(MLAInputError, match=r"c_kv: expected shape \[tokens, 32\], got \(3, 31\)"):
        cache.append(0, torch.randn(3, 31), torch.randn(3, 8))
    with pytest.raises(MLAInputError, match=r"k_pe: expected shape \[3, 8\], got \(2, 8\)"):
        cache.append(0, torch.randn(3, 32), torch.randn(2, 8))
    with pytest.raises(ConfigError, match="dtype must be one of"):
        PagedLatentCache(2, 4, 32, 8, dtype="int8")
    assert cache.seq_len(0) == 0


@pytest.mark.parametrize("scale_layout", ["tensor", "group"])
def test_fp8_round_trip_error(scale_layout):
    cache = PagedLatentCache(8, 16, 512, 64, dtype="fp8_e4m3", scale_layout=scale_layout)
    c_kv, k_pe = _rows(100, r=512, dr=64, seed=6)
    cache.append(0, c_kv, k_pe)
    stored = cache.dequantized().view(-1, 576)
    pages = cache.pages_of(0)
    got = torch.stack([stored[pages[t // 16] * 16 + t % 16] for t in range(100)])
    error = relative_error(got, torch.cat([c_kv, k_pe], dim=1))
    # e4m3 keeps 3 mantissa bits: about 2.6% relative error on N(0, 1) data for either layout.
    assert 0.015 < error < 0.035


def test_fp8_per_tensor_saturates_instead_of_nan():
    values = quantize_rows_per_tensor(torch.tensor([[1e6, -1e6, 3.0]]), torch.tensor([1.0]))
    assert values.float().tolist() == [[FP8_MAX, -FP8_MAX, 3.0]]


def test_fp8_per_group_scales_follow_each_groups_magnitude():
    rows = torch.randn(4, 300)
    rows[:, 128:256] *= 1000
    values, scales = quantize_rows_per_group(rows)
    assert scales.shape == (4, 3)
    assert (scales[:, 1] > 100 * scales[:, 0]).all()
    assert relative_error(dequantize(values, scales), rows) < 0.035


def test_cache_feeds_decode_for_each_dtype():
    for dtype, layout in (("bf16", "tensor"), ("fp16", "tensor"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "group")):
        fp8_scale = 0.25 if (dtype, layout) == ("fp8_e4m3", "tensor") else None
        cache = PagedLatentCache(10, 8, 512, 64, dtype=dtype, scale_layout=layout, fp8_scale=fp8_scale)
        for seq_id, n in enumerate((13, 1, 0)):
            cache.append(seq_id, *_rows(n, r=512, dr=64, seed=seq_id + 10))
        q = torch.randn(3, 1, 4, 576, dtype=torch.bfloat16)
        table, lens = cache.block_table([0, 1, 2]), cache.seq_lens([0, 1, 2])
        out, lse = mla_decode(q, cache.data, table, lens, softmax_scale=0.1, kv_scale=cache.scale)
        ref_out, _ = reference_decode(
            q, cache.dequantized(), table, lens, kv_lora_rank=512, softmax_scale=0.1, compute_dtype=torch.float64
        )
        assert relative_error(out, ref_out) < 1e-2, dtype
        assert torch.isneginf(lse[2]).all()


def test_free_of_an_unknown_or_already_freed_sequence_raises_unless_missing_ok():
    cache = PagedLatentCache(3, 4, 32, 8)
    cache.append(0, *_rows(5))
    with pytest.raises(MLAInputError, match=r"seq_id: expected a sequence this cache holds \(held: \[0\]\), got 7"):
        cache.free(7)
    cache.free(0)
    with pytest.raises(MLAInputError, match=r"\(none held\), got 0 \(never appended, or already freed\)"):
        cache.free(0)
    cache.free(0, missing_ok=True)
    cache.free(12, missing_ok=True)
    assert cache.allocator.num_free == 3


@pytest.mark.parametrize(
    "pages, refusal",
    [
        ([0, 1], r"got page 0, which is already free"),  # freed twice (issue 27: num_free 6 of 4 afterwards)
        ([3], r"got page 3, which is already free"),  # never handed out
        ([2, 2], r"got page 2, which is listed twice"),
        ([4], r"got 4, not a page index in \[0, 4\)"),
        ([-1], r"got -1, not a page index"),
        (["2"], r"got '2', not a page index"),
    ],
)
def test_page_allocator_refuses_a_page_it_does_not_hold_and_changes_nothing(pages, refusal):
    from mlakit.cache import PageAllocator
    from mlakit.errors import MLAInputError

    allocator = PageAllocator(4)
    taken = allocator.allocate(3)
    allocator.free([0, 1])
    state = (allocator.num_free, list(allocator._free))
    with pytest.raises(MLAInputError, match=r"^pages: expected pages this allocator handed out and does not hold, " + refusal):
        allocator.free(pages)
    assert (allocator.num_free, list(allocator._free)) == state
    allocator.free([taken[2]])
    assert sorted(allocator.allocate(4)) == [0, 1, 2, 3]


# kv_quant edge cases found by mutation testing (TESTING.md, "Mutation check"): each test below
# fails for one or more one-line mutants of src/mlakit/cache/kv_quant.py that the tests above pass.


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_scale_mode_needs_fp8_values_and_a_scale():
    gen = _gen(40)
    rows = torch.randn(3, 16, generator=gen) * 4
    per_tensor, per_group = torch.rand(1, generator=gen) + 0.5, torch.rand(3, 1, generator=gen) + 0.5
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for scale in (None, per_tensor, per_group):  # a scale given with 16/32-bit values means nothing
            assert scale_mode(rows.to(dtype), scale) == SCALE_NONE, (dtype, scale)
    fp8 = rows.to(FP8_DTYPE)
    assert scale_mode(fp8, None) == SCALE_NONE
    assert scale_mode(fp8, per_tensor) == SCALE_PER_TENSOR and scale_mode(fp8, per_group) == SCALE_PER_GROUP


def test_a_value_exactly_at_the_saturation_threshold_is_counted():
    gen = _gen(41)
    scale = torch.tensor([2.0 ** int(torch.randint(-4, 5, (), generator=gen))])  # 464 * scale exact
    rows = torch.randn(6, 40, generator=gen) * scale * 50  # |value / scale| far below 464
    positions = torch.randperm(rows.numel(), generator=gen)[:9]
    at_threshold, just_below = positions[:5], positions[5:]
    signs = torch.where(torch.rand(9, generator=gen) < 0.5, -1.0, 1.0)
    below = torch.nextafter(torch.tensor(FP8_SATURATION), torch.tensor(0.0))
    rows.view(-1)[at_threshold] = signs[:5] * FP8_SATURATION * scale
    rows.view(-1)[just_below] = signs[5:] * below * scale
    counts = torch.zeros(2, dtype=torch.int64)
    stored = quantize_rows_per_tensor(rows, scale, counts).float().view(-1)
    assert counts.tolist() == [5, 0]
    assert torch.equal(stored[positions], signs * FP8_MAX), "both round to 448; only the first five saturate"


class _CastGivingNanOnOverflow(torch.overrides.TorchFunctionMode):
    """A plain `.to(float8_e4m3fn)` that gives NaN for |value| >= 464 and for inf (a non-saturating
    cast, as torch 2.11 does for inf), where torch 2.13 on a CPU saturates at 448."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.Tensor.to and out.dtype == FP8_DTYPE and args[0].dtype != FP8_DTYPE:
            overflow = ~(args[0].float().abs() < FP8_SATURATION)
            out = torch.where(overflow, torch.nan, out.float()).to(FP8_DTYPE)
        return out


def test_quantizers_saturate_whatever_the_plain_casts_overflow_rule():
    gen = _gen(42)
    rows = torch.randn(5, 300, generator=gen) * 20
    positions = torch.randperm(rows.numel(), generator=gen)[:12]
    rows.view(-1)[positions] = torch.tensor([1e6, -1e6, 3e3, -3e3, 470.0, -470.0, 1e30, -1e30, 500.0, -500.0, 2e4, -2e4])
    scale = torch.rand(1, generator=gen) + 0.5
    expected = quantize_rows_per_tensor(rows, scale).view(torch.uint8)
    expected_group = [t.clone() for t in quantize_rows_per_group(rows)]
    with _CastGivingNanOnOverflow():
        assert torch.tensor([1e3, -1e3]).to(FP8_DTYPE).float().isnan().all(), "the mode must be in force"
        got = quantize_rows_per_tensor(rows, scale).view(torch.uint8)
        got_group = quantize_rows_per_group(rows)
    assert torch.equal(got, expected)
    assert torch.equal(got_group[0].view(torch.uint8), expected_group[0].view(torch.uint8))
    assert torch.equal(got_group[1], expected_group[1])
    assert (dequantize(got.view(FP8_DTYPE), None).view(-1)[positions].abs() == FP8_MAX).all()


def test_per_group_quantization_keeps_float32_scales_and_the_rows_device_whatever_the_defaults():
    gen = _gen(43)
    rows = torch.randn(4, 300, generator=gen) * torch.rand(4, 1, generator=gen) * 30
    values, scales = quantize_rows_per_group(rows)
    assert scales.dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        values64, scales64 = quantize_rows_per_group(rows)
    finally:
        torch.set_default_dtype(previous)
    assert scales64.dtype == torch.float32 and torch.equal(scales64, scales)
    assert torch.equal(values64.view(torch.uint8), values.view(torch.uint8))
    with torch.device("meta"):  # e.g. torch.set_default_device("cuda") in an engine, with rows on the CPU
        on_meta_default = quantize_rows_per_group(rows)
    assert [t.device.type for t in on_meta_default] == ["cpu", "cpu"]
    assert torch.equal(on_meta_default[0].view(torch.uint8), values.view(torch.uint8)) and torch.equal(on_meta_default[1], scales)


def test_per_group_scale_ignores_non_finite_values_of_small_groups_and_is_one_for_a_group_without_finite_values():
    gen = _gen(44)
    rows = torch.randn(3, 300, generator=gen) * 0.01  # every |value| < 1
    positions = torch.randint(0, 256, (3,), generator=gen)
    rows[torch.arange(3), positions] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    rows[1, 256:] = torch.tensor([float("inf"), float("-inf"), float("nan")])[torch.randint(0, 3, (44,), generator=gen)]
    values, scales = quantize_rows_per_group(rows)
    finite = torch.where(rows.isfinite(), rows.abs(), 0)
    expected = torch.stack([finite[:, :128].amax(1), finite[:, 128:256].amax(1), finite[:, 256:].amax(1)], 1) / FP8_MAX
    expected[1, 2] = 1.0  # group 2 of row 1 holds no finite value
    assert torch.equal(scales, expected)
    assert values.float()[1, 256:].isnan().all() and values.float().isnan().sum() == 3 + 44


def test_auto_scale_from_rows_smaller_than_one():
    gen = _gen(45)
    rows = torch.randn(6, 64, generator=gen) * 0.05
    rows[2, 7] = float("inf")
    amax = torch.where(rows.isfinite(), rows.abs(), 0).amax()
    assert 0 < amax < 1
    assert torch.equal(fp8_scale_from_rows(rows), (amax * AUTO_SCALE_HEADROOM / FP8_MAX).reshape(1))
    assert torch.equal(fp8_scale_from_rows(rows[:, :1] * 1e-30, headroom=1.0), (rows[:, :1] * 1e-30).abs().amax().reshape(1) / FP8_MAX)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_computes_in_the_requested_dtype_for_both_layouts(dtype):
    """The scale is rounded to `dtype` as the values are, so the two layouts agree bit for bit."""
    gen = _gen(46)
    codes = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE)
    codes = codes[codes.float().isfinite()]  # every finite e4m3 value, 254 of them: two groups a row
    values = codes[torch.argsort(torch.rand(6, codes.numel(), generator=gen), dim=1)]
    for scale in torch.rand(8, 1, generator=gen) * 3 + 0.01:  # not representable in 16 bits
        assert scale.to(dtype).float() != scale
        per_tensor = dequantize(values, scale, dtype)
        per_group = dequantize(values, scale.expand(6, 2).contiguous(), dtype)
        assert per_tensor.dtype == dtype and per_group.dtype == dtype
        assert torch.equal(per_tensor, values.to(dtype) * scale.to(dtype)), scale
        assert torch.equal(per_group, per_tensor), scale


@pytest.mark.parametrize("keyword, value, pattern", [
    ("device", "gpu", r"device: expected a torch device such as 'cpu' or 'cuda:0', got 'gpu'"),
    ("dtype", ["bf16"], r"dtype must be one of \['bf16', 'fp16', 'fp8_e4m3', 'fp32'\], got \['bf16'\]"),
    ("scale_layout", ["tensor"], r"scale_layout must be one of \('tensor', 'group'\), got \['tensor'\]"),
])
def test_the_cache_names_a_bad_device_dtype_or_scale_layout(keyword, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        PagedLatentCache(2, 4, 8, 4, **{keyword: value})
