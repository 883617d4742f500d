"""The fused gather + decompression kernel (`kernels.gather_decompress`) against
`mha_prefill.gather_rows` + `decompress` computed in float32, under the interpreter on CPU."""

from __future__ import annotations

import pytest
import torch
from triton.backends.compiler import BaseBackend
from triton.runtime.jit import native_specialize_impl

from mlakit.prefill import mha as mha_prefill
from mlakit.errors import MLAInputError
from mlakit.kernels import gather_decompress as gd
from mlakit.kernels.gather_decompress import GatherTuning, gather_decompress, supports

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _reference(rows: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor, heads: int,
               nope: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gathered = mha_prefill.gather_rows(rows.cpu(), None, slots.cpu().long(), torch.float32)
    return mha_prefill.decompress(gathered, weight.cpu().float(), heads, nope)


def _assert_matches(got: tuple[torch.Tensor, ...], rows: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor,
                    heads: int, nope: int) -> None:
    k_nope, k_pe, v = got
    want_nope, want_pe, want_v = _reference(rows, slots, weight, heads, nope)
    assert k_nope.shape == want_nope.shape and k_pe.shape == want_pe.shape and v.shape == want_v.shape
    assert k_nope.dtype == k_pe.dtype == v.dtype == rows.dtype
    for name, actual, expected in (("k_nope", k_nope, want_nope), ("v", v, want_v)):
        assert torch.isfinite(actual.float()).all(), name
        torch.testing.assert_close(actual.cpu().float(), expected.to(rows.dtype).float(), rtol=1e-2, atol=1e-2,
                                   msg=lambda text, name=name: f"{name}: {text}")
    assert torch.equal(k_pe.cpu(), want_pe.to(rows.dtype)), "k_pe: not an exact copy of the rope columns"


def _inputs(num_rows: int, m: int, heads: int, nope: int, v_dim: int, rank: int, rope: int, dtype: torch.dtype,
            slot_dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A cache whose rows no slot names hold NaN, slots in random order with repeats, a weight."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(num_rows, rank + rope, generator=gen).to(dtype)
    slots = torch.randint(0, num_rows // 2, (m,), generator=gen)
    if m > 2:
        slots[-1] = slots[0]
    unnamed = torch.ones(num_rows, dtype=torch.bool)
    unnamed[slots] = False
    rows[unnamed] = float("nan")
    weight = (torch.randn(heads * (nope + v_dim), rank, generator=gen) / rank ** 0.5).to(dtype)
    return rows.to(DEVICE), slots.to(slot_dtype).to(DEVICE), weight.to(DEVICE)


CASES = [  # m, heads, nope, v, rank, rope, dtype, slots' dtype
    (37, 3, 16, 16, 48, 8, torch.bfloat16, torch.int64),
    (40, 2, 16, 16, 48, 8, torch.float16, torch.int32),
    (16, 1, 16, 16, 48, 8, torch.bfloat16, torch.int32),
    (1, 3, 16, 16, 48, 8, torch.float16, torch.int64),
    (23, 3, 16, 8, 40, 8, torch.bfloat16, torch.int32),  # K edge (40 = 2.5 tiles), N edge (72 columns)
    (9, 3, 6, 5, 24, 7, torch.float16, torch.int64),  # 33 GEMM columns: k_pe at column 40, rows 48 wide
    (5, 1, 128, 128, 512, 64, torch.bfloat16, torch.int32),  # DeepSeek widths
]


@pytest.mark.parametrize(("m", "heads", "nope", "v_dim", "rank", "rope", "dtype", "slot_dtype"), CASES)
def test_equals_gather_rows_and_decompress_in_float32(m: int, heads: int, nope: int, v_dim: int, rank: int, rope: int,
                                                      dtype: torch.dtype, slot_dtype: torch.dtype) -> None:
    rows, slots, weight = _inputs(2 * m + 6, m, heads, nope, v_dim, rank, rope, dtype, slot_dtype, seed=m * 100 + rank)
    _assert_matches(gather_decompress(rows, slots, weight, heads, nope), rows, slots, weight, heads, nope)


def test_reads_strided_and_misaligned_views_of_the_cache_and_weight() -> None:
    """rows: pages `[num_pages, page_size, width + 5]` flattened and cut to `width` (row stride > width), starting 3
    elements in (a pointer not 16-byte aligned); weight: a column slice of a wider matrix."""
    heads, nope, v_dim, rank, rope, m = 3, 16, 16, 48, 8, 29
    rows, slots, weight = _inputs(40, m, heads, nope, v_dim, rank, rope, torch.bfloat16, torch.int64, seed=4)
    pages = torch.full((5, 8, 3 + rank + rope + 5), float("nan"), dtype=rows.dtype, device=DEVICE)
    pages.flatten(0, 1)[:, 3:3 + rank + rope] = rows
    strided = pages.flatten(0, 1)[:, 3:3 + rank + rope]
    wide = torch.full((weight.shape[0], rank + 24), float("nan"), dtype=weight.dtype, device=DEVICE)
    wide[:, 16:16 + rank] = weight
    strided_weight = wide[:, 16:16 + rank]
    assert strided.stride(0) == rank + rope + 8 and strided.data_ptr() % 16 != 0 and strided_weight.stride(0) == rank + 24
    _assert_matches(gather_decompress(strided, slots, strided_weight, heads, nope), rows, slots, weight, heads, nope)


@pytest.mark.parametrize("tuning", [GatherTuning(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2),
                                    GatherTuning(block_m=16, block_n=64, block_k=16)])
def test_other_tiles_give_the_same_result(tuning: GatherTuning) -> None:
    heads, nope, v_dim, rank, rope, m = 3, 16, 16, 48, 8, 37  # rank 48 = 1.5 tiles of 32
    rows, slots, weight = _inputs(80, m, heads, nope, v_dim, rank, rope, torch.float16, torch.int32, seed=5)
    _assert_matches(gather_decompress(rows, slots, weight, heads, nope, tuning=tuning), rows, slots, weight, heads, nope)


def test_views_are_decompress_views_of_one_aligned_buffer() -> None:
    """Shapes, head and channel strides as `decompress` gives them; rows of the one buffer start 16-byte aligned, k_pe
    right after the GEMM columns (rounded up to 16 bytes)."""
    for heads, nope, v_dim, rank, rope in ((3, 16, 16, 48, 8), (3, 6, 5, 24, 7), (1, 128, 128, 512, 64)):
        rows, slots, weight = _inputs(12, 5, heads, nope, v_dim, rank, rope, torch.bfloat16, torch.int64, seed=6)
        k_nope, k_pe, v = gather_decompress(rows, slots, weight, heads, nope)
        want = mha_prefill.decompress(rows[slots], weight, heads, nope)
        for got, expected in zip((k_nope, k_pe, v), want):
            assert got.shape == expected.shape and got.stride()[1:] == expected.stride()[1:]
        row_stride = k_nope.stride(0)
        assert k_pe.stride(0) == v.stride(0) == row_stride and row_stride * 2 % 16 == 0
        assert row_stride >= heads * (nope + v_dim) + rope
        assert k_nope.untyped_storage().data_ptr() == k_pe.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
        assert k_nope.data_ptr() % 16 == 0 and k_pe.data_ptr() % 16 == 0
        assert (k_pe.data_ptr() - k_nope.data_ptr()) // 2 == -(-heads * (nope + v_dim) // 8) * 8
        assert v.data_ptr() - k_nope.data_ptr() == nope * 2


def test_no_slots_give_empty_views_without_a_launch(monkeypatch) -> None:
    monkeypatch.setattr(gd, "_GATHER_DECOMPRESS", lambda *args: pytest.fail("launched for m == 0"))
    rows, _, weight = _inputs(6, 0, 2, 16, 16, 48, 8, torch.bfloat16, torch.int64, seed=7)
    k_nope, k_pe, v = gather_decompress(rows, torch.zeros(0, dtype=torch.int64, device=DEVICE), weight, 2, 16)
    assert k_nope.shape == (0, 2, 16) and k_pe.shape == (0, 8) and v.shape == (0, 2, 16)


def _specialization(args: tuple, constants: dict) -> tuple:
    """What Triton compiles a launch for: each runtime argument's type and specialization (as the kernel's
    `do_not_specialize` lists allow), and the constants."""
    kernel = gd._gather_decompress_kernel
    options = kernel.kwargs if hasattr(kernel, "kwargs") else vars(kernel)  # the interpreter keeps jit's keywords
    unspecialized = set(options.get("do_not_specialize") or ())
    return (tuple(native_specialize_impl(BaseBackend, a, False, name not in unspecialized, name not in unspecialized)
                  for name, a in zip(kernel.arg_names, args)),
            tuple(sorted(constants.items())))


def test_launch_key_holds_what_triton_specializes_on(monkeypatch) -> None:
    """On GPUs `CachedLaunch` reruns the kernel compiled for the first call of a key (the interpreter compiles every
    call, so the key is checked here): two launches share a key exactly when Triton specializes them alike."""
    launches, launch = [], gd._GATHER_DECOMPRESS

    def recorded(key: object, grid: tuple[int, int, int], args: tuple, constants: dict) -> None:
        launches.append((key, _specialization(args, constants)))
        launch(key, grid, args, constants)

    monkeypatch.setattr(gd, "_GATHER_DECOMPRESS", recorded)
    heads, nope, v_dim, rank, rope = 2, 16, 16, 48, 8
    rows, slots, weight = _inputs(96, 40, heads, nope, v_dim, rank, rope, torch.bfloat16, torch.int64, seed=8)
    calls = [(rows, slots[:m], weight) for m in (1, 3, 18, 16, 32)]
    for offset in (1, 2, 8):  # rows 2, 4 and 16 bytes into a buffer
        store = torch.empty(offset + rows.numel(), dtype=rows.dtype, device=DEVICE)
        calls.append((store[offset:].view_as(rows).copy_(rows), slots[:18], weight))
    for offset in (1, 2):  # slots 8 and 16 bytes in
        slot_store = torch.empty(offset + 18, dtype=slots.dtype, device=DEVICE)
        calls.append((rows, slot_store[offset:].copy_(slots[:18]), weight))
    calls += [(rows, slots[:18].int(), weight), (rows.half(), slots[:18], weight.half()),
              (torch.cat([rows, rows[:, :8]], 1)[:, :rank + rope], slots[:18], weight),  # row stride 64: a multiple of 16
              (rows, slots[:18], torch.cat([weight, weight[:, :1]], 1)[:, :rank]),  # weight row stride 49
              (rows[:, :rank + 4], slots[:18], weight)]
    for call_rows, call_slots, call_weight in calls:
        _assert_matches(gather_decompress(call_rows, call_slots, call_weight, heads, nope), call_rows, call_slots,
                        call_weight, heads, nope)
    keys = {key for key, _ in launches}
    pairs = {(key, spec) for key, spec in launches}
    assert len(keys) == len(pairs) == len({spec for _, spec in launches}) == 8
    assert len({key for key, _ in launches[:5]}) == 1, "row counts (1, 3, 18, 16, 32) share one kernel (warm_up's)"


@pytest.mark.parametrize(("rows", "weight", "heads", "message"), [
    (torch.zeros(4, 56, dtype=torch.bfloat16), torch.zeros(64, 48, dtype=torch.float16), 2,
     "kv_b_weight: expected rows' dtype torch.bfloat16, got torch.float16"),
    (torch.zeros(4, 56), torch.zeros(64, 48), 2, "rows: expected a bf16 or fp16 cache, got torch.float32"),
    (torch.zeros(4, 56, dtype=torch.float8_e4m3fn), torch.zeros(64, 48, dtype=torch.float8_e4m3fn), 2,
     "rows: expected a bf16 or fp16 cache, got torch.float8_e4m3fn"),
    (torch.zeros(4, 56, dtype=torch.half), torch.zeros(64, 48, dtype=torch.half), 3,
     "kv_b_weight: expected a row count that is a multiple of heads=3, got 64 rows"),
    (torch.zeros(56, 4, dtype=torch.half).t(), torch.zeros(64, 48, dtype=torch.half), 2,
     "rows, kv_b_weight: expected contiguous last dims"),
])
def test_refuses_what_the_kernel_cannot_read(rows: torch.Tensor, weight: torch.Tensor, heads: int, message: str) -> None:
    with pytest.raises(MLAInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gather_decompress(rows, torch.zeros(3, dtype=torch.int64), weight, heads, 16)


def test_refuses_strided_slots() -> None:
    rows, weight = torch.zeros(4, 56, dtype=torch.half), torch.zeros(64, 48, dtype=torch.half)
    with pytest.raises(MLAInputError, match=r"slots: expected a contiguous \[m\] tensor, got stride 2"):
        gather_decompress(rows, torch.zeros(6, dtype=torch.int64)[::2], weight, 2, 16)


def test_supports_16_bit_caches_of_the_weight_dtype_only() -> None:
    bf16, half = torch.zeros(4, 56, dtype=torch.bfloat16), torch.zeros(4, 56, dtype=torch.half)
    assert supports(bf16, torch.zeros(64, 48, dtype=torch.bfloat16)) and supports(half, torch.zeros(64, 48).half())
    assert not supports(bf16, torch.zeros(64, 48, dtype=torch.half))
    assert not supports(torch.zeros(4, 56), torch.zeros(64, 48))
    assert not supports(torch.zeros(4, 56, dtype=torch.float8_e4m3fn), torch.zeros(64, 48, dtype=torch.bfloat16))
    assert not supports(torch.zeros(56, 4, dtype=torch.bfloat16).t(), torch.zeros(64, 48, dtype=torch.bfloat16))


@pytest.mark.parametrize("field", ["block_m", "block_n", "block_k"])
@pytest.mark.parametrize("value", [8, 48])
def test_tuning_refuses_tiles_that_are_not_powers_of_two_from_16(field: str, value: int) -> None:
    with pytest.raises(MLAInputError, match=f"GatherTuning.{field}: expected a power of two >= 16, got {value}"):
        GatherTuning(**{field: value})
