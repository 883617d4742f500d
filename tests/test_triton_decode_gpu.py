"""The Triton decode kernel on a GPU over the full grid, and captured in a CUDA graph."""

import dataclasses
import importlib.util
import itertools
import math
from unittest import mock

import pytest
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import mlakit
from mlakit.kernels.decode_split_plan import share_plans_laid_out_right
from mlakit.kernels.gluon_compat import thread_barrier
from mlakit.serving.graphs import capture_graph
from mlakit.kernels.hopper_decode.next_unit_prefetch import PIECE_COUNT, PIECES, allocate_pieces, stage_next_unit
from mlakit.kernels.hopper_decode.seesaw_kernel import _runs, _unit_item, _unit_work
from mlakit.kernels.triton_decode import triton_mla_decode
from paged_inputs import (E4M3_QUERY_EXPONENTS, QUERY_EXPONENTS, assert_lse_close, make_paged_batch, relative_error,
                          with_query_magnitudes, with_subnormal_pages)

pytestmark = pytest.mark.gpu

HEADS = [1, 5, 16, 20, 40, 64, 128]
PAGE_SIZES = [1, 16, 32, 64, 128]
KV_FORMATS = [("bf16", "tensor"), ("fp16", "tensor"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "group")]
LATENTS = [(512, 64), (256, 32)]


def _reference(batch):
    return mlakit.reference_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale,
    )


def _check(batch, **kwargs):
    out, lse = triton_mla_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, **kwargs,
    )
    ref_out, ref_lse = _reference(batch)
    fp8 = batch.kv_cache.dtype == torch.float8_e4m3fn
    assert torch.isfinite(out.float()).all()
    error = relative_error(out, ref_out)
    assert error < (3e-2 if fp8 else 1e-2), error
    assert_lse_close(lse, ref_lse, atol=3e-2 if fp8 else 1e-3)
    return out, lse


def _split_kernel(batch, plan):
    from mlakit.kernels.triton_decode import split_kernel_for
    from mlakit.cache.kv_quant import scale_mode

    q = batch.q.reshape(-1, *batch.q.shape[2:])
    return split_kernel_for(q, batch.kv_cache, batch.kv_lora_rank, scale_mode(batch.kv_cache, batch.kv_scale), plan)[0]


@pytest.mark.parametrize("heads, q_len", [(h, q) for h in HEADS for q in (1, 2, 4, 8) if h * q <= 1024])
@pytest.mark.parametrize("kv_lora_rank, rope_dim", LATENTS)
def test_heads_and_draft_lengths(heads, q_len, kv_lora_rank, rope_dim):
    batch = make_paged_batch(
        [1000, 0, 3, 257, 64], heads=heads, q_len=q_len, page_size=64, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim,
        device="cuda", seed=heads * 10 + q_len,
    )
    _check(batch)


@pytest.mark.parametrize("page_size, kv_format", list(itertools.product(PAGE_SIZES, KV_FORMATS)))
def test_page_sizes_and_kv_dtypes(page_size, kv_format):
    kv_dtype, layout = kv_format
    batch = make_paged_batch(
        [777, 1, 0, 2049, 128], heads=16, q_len=2, page_size=page_size, kv_lora_rank=512, rope_dim=64,
        kv_dtype=kv_dtype, scale_layout=layout, q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16,
        device="cuda", seed=page_size,
    )
    _check(batch)


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_128_heads_with_every_kv_format(kv_format):
    kv_dtype, layout = kv_format
    batch = make_paged_batch(
        [2000, 0, 65], heads=128, q_len=2, page_size=64, kv_lora_rank=512, rope_dim=64, kv_dtype=kv_dtype,
        scale_layout=layout, q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16, device="cuda",
    )
    _check(batch)


@pytest.mark.parametrize("num_sms", [1, 132, 1024])
def test_long_sequences_with_forced_split_counts(num_sms):
    batch = make_paged_batch([16384, 5, 9000], heads=128, page_size=64, kv_lora_rank=512, rope_dim=64, device="cuda", seed=num_sms)
    _check(batch, num_sms=num_sms)


def test_auto_picks_triton_on_this_gpu_unless_flashmla_is_installed():
    batch = make_paged_batch([100], heads=16, page_size=64, kv_lora_rank=512, rope_dim=64, device="cuda")
    plan = mlakit.resolve(mlakit.ServingConfig(), mlakit.MLAShape.preset("deepseek-v3"))
    flashmla_fits = importlib.util.find_spec("flash_mla") is not None and torch.cuda.get_device_capability()[0] in (9, 10)
    assert plan.decode_backend == ("flashmla" if flashmla_fits else "triton")
    out, _ = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, softmax_scale=batch.softmax_scale)
    assert relative_error(out, _reference(batch)[0]) < 1e-2


def test_split_plan_in_a_cuda_graph_replays_with_new_lengths():
    max_batch, page_size, max_pages, heads = 8, 64, 64, 16
    gen = torch.Generator(device="cuda").manual_seed(0)
    num_pages = max_batch * max_pages
    kv = torch.randn(num_pages, page_size, 576, device="cuda", generator=gen).bfloat16()
    q = torch.randn(max_batch, 1, heads, 576, device="cuda", generator=gen).bfloat16()
    table = torch.randperm(num_pages, device="cuda", generator=gen).view(max_batch, max_pages).int()
    lengths = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    scale = 192**-0.5

    def step():
        return mlakit.mla_decode(q, kv, table, lengths, softmax_scale=scale, backend="triton", check_inputs=False)

    graph, (out, lse) = capture_graph(step, warmup=1, forbid_host_sync=True)
    for replay in range(6):
        new_lengths = torch.randint(0, max_pages * page_size + 1, (max_batch,), generator=gen, device="cuda", dtype=torch.int32)
        new_lengths[replay % max_batch] = 0
        lengths.copy_(new_lengths)
        q.copy_(torch.randn(q.shape, device="cuda", generator=gen).bfloat16())
        graph.replay()
        ref_out, ref_lse = mlakit.reference_decode(q, kv, table, lengths, kv_lora_rank=512, softmax_scale=scale)
        assert relative_error(out, ref_out) < 1e-2
        assert_lse_close(lse, ref_lse, atol=1e-3)


@pytest.mark.parametrize("heads, page_size, kv_format", [(128, 64, ("bf16", "tensor")), (16, 1, ("fp8_e4m3", "group")),
                                                          (20, 32, ("fp16", "tensor")), (5, 128, ("fp8_e4m3", "tensor"))])
def test_extend_with_ragged_segments_matches_reference(heads, page_size, kv_format):
    from mlakit.kernels.triton_decode import triton_mla_extend

    kv_dtype, layout = kv_format
    prefix, new = [3000, 0, 17, 900], [5, 64, 1, 0]
    batch = make_paged_batch(
        [p + n for p, n in zip(prefix, new)], heads=heads, page_size=page_size, kv_lora_rank=512, rope_dim=64,
        kv_dtype=kv_dtype, scale_layout=layout, q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16,
        device="cuda", seed=heads,
    )
    q = torch.randn(sum(new), heads, 576, device="cuda").to(batch.q.dtype)
    cu = torch.tensor([0, 5, 69, 70, 70], dtype=torch.int32, device="cuda")
    kwargs = dict(kv_lora_rank=512, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    out, lse = triton_mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, max_q_len=64, **kwargs)
    ref_out, ref_lse = mlakit.reference_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, **kwargs)
    fp8 = kv_dtype == "fp8_e4m3"
    assert relative_error(out, ref_out) < (3e-2 if fp8 else 1e-2)
    assert_lse_close(lse, ref_lse, atol=3e-2 if fp8 else 1e-3)


def _on_hopper() -> bool:
    return torch.cuda.get_device_capability()[0] == 9


# Tests of equal-share plans need a plan kernel checked to lay them out right (`share_plans_laid_out_right`: a
# Triton version of SHARE_PLAN_TRITONS).
needs_share_plans = pytest.mark.skipif(not share_plans_laid_out_right(),
                                       reason="this Triton's plan kernel takes no equal shares (SHARE_PLAN_TRITONS)")


@gluon.jit
def _staged_pieces_kernel(STAGED, Q, KV, BLOCK_TABLE, WORK, SEQLENS, Q_STRIDES, kv_row_stride, stride_bt_b, row_tiles,
                          work_rows, HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Program u stages unit u's prefetch pieces as the seesaw does for a next unit, and writes them to row u."""
    unit = gl.program_id(0)
    work = _unit_work(WORK, SEQLENS, unit, row_tiles, work_rows)
    tile = unit % row_tiles
    pieces = allocate_pieces()
    stage_next_unit(pieces, Q, KV, BLOCK_TABLE, WORK, work, _unit_item(unit, row_tiles, work_rows), tile,
                    _runs(work, tile, HEADS), Q_STRIDES, kv_row_stride, stride_bt_b, HEADS, PAGE_SIZE)
    thread_barrier()
    piece = gl.arange(0, PIECE_COUNT, layout=PIECES)
    gl.store(STAGED + unit * PIECE_COUNT + piece, pieces.load(PIECES))


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("page_size", [16, 64])
def test_short_ragged_extend_segments_on_the_narrow_fp8_kernel(page_size):
    """Segments of 1, 2 and 0 new tokens at 16 heads: at most 32 rows each, so the narrow kernel runs
    them (two 16-row programs for the 2-token segment, first tokens offset by the packing)."""
    from mlakit.kernels.triton_decode import plan_extend, triton_mla_extend

    prefix, new = [700, 65, 0, 130], [1, 2, 0, 2]
    batch = make_paged_batch([p + n for p, n in zip(prefix, new)], heads=16, page_size=page_size, kv_lora_rank=512,
                             rope_dim=64, kv_dtype="fp8_e4m3", device="cuda", seed=page_size)
    q = torch.randn(sum(new), 16, 576, device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, 1, 3, 3, 5], dtype=torch.int32, device="cuda")
    plan = plan_extend(batch.cache_seqlens, cu, max_q_len=2, heads=16, kv_dtype=batch.kv_cache.dtype)
    assert _split_kernel(dataclasses.replace(batch, q=q[:, None]), plan) == "narrow"
    kwargs = dict(kv_lora_rank=512, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    out, lse = triton_mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, max_q_len=2, plan=plan,
                                 **kwargs)
    ref_out, ref_lse = mlakit.reference_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, **kwargs)
    assert relative_error(out, ref_out) < 3e-2
    assert_lse_close(lse, ref_lse, atol=3e-2)


HOPPER_CASES = [  # heads, q_len, page_size, (kv_lora_rank, rope_dim), q_dtype
    (128, 1, 64, (512, 64), torch.bfloat16), (128, 2, 1, (512, 64), torch.bfloat16), (64, 1, 16, (512, 64), torch.float16),
    (40, 2, 128, (256, 32), torch.bfloat16), (5, 8, 32, (512, 64), torch.bfloat16), (20, 4, 64, (128, 16), torch.float16),
    (33, 3, 64, (512, 64), torch.bfloat16), (16, 1, 64, (512, 64), torch.bfloat16), (5, 1, 32, (512, 64), torch.float16),
    (16, 2, 1, (512, 64), torch.bfloat16), (1, 1, 128, (256, 32), torch.bfloat16), (12, 2, 64, (64, 16), torch.bfloat16),
]
HOPPER_FP8_CASES = [
    (128, 1, 64, (512, 64), torch.bfloat16), (16, 2, 16, (512, 64), torch.bfloat16), (5, 3, 1, (512, 64), torch.float16),
    (40, 1, 128, (256, 32), torch.bfloat16), (16, 1, 32, (128, 16), torch.float16), (12, 2, 64, (64, 16), torch.bfloat16),
    (5, 3, 32, (512, 64), torch.float16), (1, 1, 16, (256, 32), torch.bfloat16), (4, 8, 128, (512, 64), torch.bfloat16),
    (64, 2, 128, (512, 64), torch.float16), (20, 4, 64, (512, 64), torch.bfloat16),
]


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize(
    "heads, q_len, page_size, latent, q_dtype, kv_dtype",
    [(*case, "fp16" if case[-1] == torch.float16 else "bf16") for case in HOPPER_CASES]
    + [(*case, "fp8_e4m3") for case in HOPPER_FP8_CASES],
)
@pytest.mark.parametrize("num_sms", [None, 1024])
def test_hopper_kernel_matches_reference_and_portable_kernel(heads, q_len, page_size, latent, q_dtype, kv_dtype, num_sms):
    from mlakit.kernels.triton_decode import plan_decode

    kv_lora_rank, rope_dim = latent
    batch = make_paged_batch(
        [3000, 0, 1, 63, 700], heads=heads, q_len=q_len, page_size=page_size, kv_lora_rank=kv_lora_rank,
        rope_dim=rope_dim, kv_dtype=kv_dtype, scale_layout="tensor", q_dtype=q_dtype, device="cuda", seed=heads + page_size,
    )
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype, num_sms=num_sms)
    narrow = kv_dtype == "fp8_e4m3" and heads * q_len <= 32 and (page_size in (16, 32) or page_size % 64 == 0)
    assert _split_kernel(batch, plan) == ("narrow" if narrow else "hopper")
    _check(batch, plan=plan)
    portable = dataclasses.replace(plan, tuning=dataclasses.replace(plan.tuning, tier="portable"))
    kwargs = dict(kv_lora_rank=kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, plan=plan, **kwargs)
    ref_out, ref_lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, plan=portable, **kwargs)
    assert relative_error(out, ref_out) < 1e-2
    assert_lse_close(lse, ref_lse, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_seesaw_reads_cache_rows_padded_past_their_width(kv_dtype):
    """Cache rows wider than the latent and rope columns (a view of a padded cache, NaN in the padding): the
    seesaw's TMA descriptors take the row stride, not the width."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([3000, 0, 1, 63, 700], heads=128, q_len=2, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=11)
    pages, page_size, width = batch.kv_cache.shape
    dtype = batch.kv_cache.dtype
    nan_bytes = torch.full((pages, page_size, (width + 64) * dtype.itemsize), 0xFF, dtype=torch.uint8, device="cuda")
    padded = nan_bytes.view(dtype)
    padded[..., :width] = batch.kv_cache
    view = dataclasses.replace(batch, kv_cache=padded[..., :width])
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=128, kv_dtype=dtype)
    assert view.kv_cache.stride(1) == width + 64 and _split_kernel(view, plan) == "hopper"
    out, lse = _check(view, plan=plan)
    ref_out, ref_lse = _check(batch, plan=plan)
    assert relative_error(out, ref_out) < 1e-5
    assert_lse_close(lse, ref_lse, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("kv_lora_rank, kv_dtype", [(448, "bf16"), (192, "fp8_e4m3"), (320, "bf16")])
def test_latent_widths_the_hopper_kernel_cannot_tile_run_on_the_portable_kernel(kv_lora_rank, kv_dtype):
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([700, 0, 65], heads=16, q_len=2, page_size=64, kv_lora_rank=kv_lora_rank, rope_dim=64,
                             kv_dtype=kv_dtype, scale_layout="tensor", device="cuda", seed=kv_lora_rank)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=16, kv_dtype=batch.kv_cache.dtype)
    assert _split_kernel(batch, plan) == "portable"
    _check(batch, plan=plan)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads, kernel", [(16, "narrow"), (128, "hopper")])
def test_hopper_fp8_conversion_keeps_subnormal_values(q_dtype, heads, kernel):
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([300, 77], heads=heads, page_size=64, kv_lora_rank=512, rope_dim=64, kv_dtype="fp8_e4m3",
                             q_dtype=q_dtype, device="cuda", seed=3)
    subnormal = with_subnormal_pages(batch, seed=4)
    plan = plan_decode(subnormal.cache_seqlens, q_len=1, heads=heads, kv_dtype=subnormal.kv_cache.dtype)
    assert _split_kernel(subnormal, plan) == kernel
    _check(subnormal, plan=plan)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("heads, page_size, kernel", [(16, 32, "narrow"), (128, 64, "hopper")])
def test_fp8_kernels_with_fp16_mmas_keep_query_rows_of_any_magnitude(q_dtype, q_len, heads, page_size, kernel):
    """The narrow kernel and the seesaw kernel run fp8 pages' MMAs in fp16 with each query row scaled
    by a power of two: rows far outside fp16's range (and an all-zero row) must come out as the
    reference's."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([900, 5, 64], heads=heads, q_len=q_len, page_size=page_size, kv_lora_rank=512,
                             rope_dim=64, kv_dtype="fp8_e4m3", q_dtype=q_dtype, device="cuda", seed=11 + q_len)
    batch = with_query_magnitudes(batch, QUERY_EXPONENTS[q_dtype])
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype)
    assert _split_kernel(batch, plan) == kernel
    _check(batch, plan=plan)


E4M3_SCORE_CASES = [  # heads, q_len, page_size, q_dtype: the seesaw kernel (more than 32 query rows), then the narrow one
    (128, 1, 64, torch.bfloat16), (128, 2, 128, torch.float16), (64, 2, 64, torch.bfloat16), (33, 3, 64, torch.bfloat16),
    (20, 4, 256, torch.bfloat16), (40, 1, 64, torch.float16),
    (16, 1, 64, torch.bfloat16), (16, 2, 32, torch.float16), (5, 3, 16, torch.bfloat16), (1, 1, 128, torch.bfloat16),
]


def _check_e4m3_scores(batch, plan, rounding_shows=True):
    """The kernel against the reference on e4m3-rounded queries (what it computes) and, where `rounding_shows`, farther
    from the one on the queries as given (so the rounding did happen; scores of subnormal pages barely move)."""
    from mlakit.reference import e4m3_rounded_queries

    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, plan=plan,
                                 kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    assert _split_kernel(batch, plan) == ("narrow" if batch.q.shape[1] * batch.q.shape[2] <= 32 else "hopper")
    assert torch.isfinite(out.float()).all()
    rounded_out, rounded_lse = _reference(dataclasses.replace(batch, q=e4m3_rounded_queries(batch.q)))
    exact_out, _ = _reference(batch)
    error = relative_error(out, rounded_out)
    assert error < 1e-2, error
    # The 8-bit tensor cores keep about 14 bits of a sum: the scores' error grows with their size (a row of lse ~ 4000
    # differs by ~2.4, NOTES.md v63).
    assert_lse_close(lse, rounded_lse, atol=1e-2, rtol=2e-3)
    if rounding_shows:
        assert relative_error(out, exact_out) > 3 * error


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("heads, q_len, page_size, q_dtype", E4M3_SCORE_CASES)
@pytest.mark.parametrize("num_sms", [None, 1024])
def test_e4m3_scores_match_the_reference_on_rounded_queries(heads, q_len, page_size, q_dtype, num_sms):
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([3000, 0, 1, 63, 700, 129], heads=heads, q_len=q_len, page_size=page_size,
                             kv_lora_rank=512, rope_dim=64, kv_dtype="fp8_e4m3", q_dtype=q_dtype, device="cuda",
                             seed=heads + q_len)
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype, num_sms=num_sms,
                       e4m3_scores=True)
    _check_e4m3_scores(batch, plan)


WIDE_NARROW_CASES = [  # heads, q_len, page_size, q_dtype: 17-32 query rows a sequence
    (16, 2, 64, torch.bfloat16), (9, 2, 16, torch.float16), (17, 1, 32, torch.bfloat16), (10, 3, 128, torch.bfloat16),
    (32, 1, 64, torch.float16),
]


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("heads, q_len, page_size, q_dtype", WIDE_NARROW_CASES)
@pytest.mark.parametrize("num_sms", [None, 2])
def test_e4m3_scores_in_the_narrow_kernels_32_row_tile(heads, q_len, page_size, q_dtype, num_sms):
    """A hint of a large batch gives 17-32 query rows a sequence one 32-row tile of the narrow kernel (over 2 SMs the
    long sequences take many splits, merged by the combine)."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([3000, 0, 1, 63, 700, 129], heads=heads, q_len=q_len, page_size=page_size,
                             kv_lora_rank=512, rope_dim=64, kv_dtype="fp8_e4m3", q_dtype=q_dtype, device="cuda",
                             seed=heads * q_len)
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype, num_sms=num_sms,
                       e4m3_scores=True, kv_tokens_hint=1 << 30)
    assert (plan.tuning.block_m, plan.geometry.row_tiles) == (32, 1)
    if num_sms == 2:
        assert plan.num_splits.max().item() > 1
    _check_e4m3_scores(batch, plan)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
def test_e4m3_scores_take_the_32_row_tile_unhinted_where_16_row_tiles_overflow_one_wave():
    """Without a hint, a batch whose 16-row tiles alone are more programs than run at once (2 x 150 > 2 x 132) runs
    the 32-row tile, exactly (NOTES.md v86)."""
    from mlakit.kernels.triton_decode import plan_decode

    lengths = torch.randint(0, 400, (150,), generator=torch.Generator().manual_seed(86)).tolist()
    batch = make_paged_batch(lengths[:-3] + [0, 1, 1000], heads=16, q_len=2, page_size=64, kv_lora_rank=512,
                             rope_dim=64, kv_dtype="fp8_e4m3", device="cuda", seed=86)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=16, kv_dtype=batch.kv_cache.dtype, num_sms=132,
                       e4m3_scores=True)
    assert (plan.tuning.block_m, plan.geometry.row_tiles) == (32, 1)
    _check_e4m3_scores(batch, plan)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
def test_a_wide_narrow_plan_at_other_widths_runs_on_the_narrow_kernels_16_row_tile():
    """The plan does not know the latent width: a 32-row plan at 256 + 32 (where the narrow kernel has no e4m3 scores,
    and a 32-row tile with fp16 MMAs spills) runs the narrow kernel's 16-row tile over the plan's splits, exactly."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([700, 0, 65], heads=16, q_len=2, page_size=64, kv_lora_rank=256, rope_dim=32,
                             kv_dtype="fp8_e4m3", device="cuda", seed=8)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=16, kv_dtype=batch.kv_cache.dtype, e4m3_scores=True,
                       kv_tokens_hint=1 << 30)
    assert plan.tuning.block_m == 32 and _split_kernel(batch, plan) == "narrow"
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, plan=plan,
                                 kv_lora_rank=256, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    expected_out, expected_lse = _reference(batch)
    assert relative_error(out, expected_out) < 1e-2
    assert_lse_close(lse, expected_lse, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_e4m3_scores_keep_query_rows_of_any_magnitude_and_subnormal_pages(q_dtype):
    """Rows from 2^-17 to 2^17 (fp16: 2^13) and an all-zero row are scaled into e4m3's range each by its own power of two; cache
    values all e4m3 subnormals reach the 8-bit MMAs as they are."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([900, 5, 64], heads=128, q_len=1, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype="fp8_e4m3", q_dtype=q_dtype, device="cuda", seed=21)
    batch = with_query_magnitudes(batch, E4M3_QUERY_EXPONENTS[q_dtype])
    plan = plan_decode(batch.cache_seqlens, q_len=1, heads=128, kv_dtype=batch.kv_cache.dtype, e4m3_scores=True)
    _check_e4m3_scores(batch, plan)
    subnormal = with_subnormal_pages(batch, seed=4)
    _check_e4m3_scores(subnormal, plan_decode(subnormal.cache_seqlens, q_len=1, heads=128,
                                              kv_dtype=subnormal.kv_cache.dtype, e4m3_scores=True),
                       rounding_shows=False)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
def test_triton_fp8_backend_decodes_and_extends_with_e4m3_scores_eagerly_and_in_a_graph():
    """`backend="triton_fp8"` through the public calls: decode with and without the step's metadata, replayed from a
    CUDA graph, and the latent extend over ragged segments, each as the reference on e4m3-rounded queries."""
    from mlakit.reference import e4m3_rounded_queries

    heads, q_len = 64, 2
    batch = make_paged_batch([2000, 1, 700, 0, 190], heads=heads, q_len=q_len, page_size=64, kv_lora_rank=512,
                             rope_dim=64, kv_dtype="fp8_e4m3", device="cuda", seed=31)
    rounded = dataclasses.replace(batch, q=e4m3_rounded_queries(batch.q))
    ref_out, ref_lse = _reference(rounded)
    kwargs = dict(softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, backend="triton_fp8")
    metadata = mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=q_len, heads=heads, backend="triton_fp8",
                                          kv_cache_dtype="fp8_e4m3")
    eager, eager_lse = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, **kwargs)
    assert relative_error(eager, ref_out) < 1e-2
    assert_lse_close(eager_lse, ref_lse, atol=1e-2, rtol=2e-3)

    def step():
        return mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, metadata=metadata,
                                 check_inputs=False, **kwargs)

    graph, (out, lse) = capture_graph(step, forbid_host_sync=True)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out, ref_out) < 1e-2
    assert_lse_close(lse, ref_lse, atol=1e-2, rtol=2e-3)

    # The draft tokens as ragged segments (1, 1, 2, 0, 1 new tokens): each as its row in the decode reference.
    new = torch.tensor([1, 1, 2, 0, 1], device="cuda")
    cu_seqlens_q = torch.nn.functional.pad(new.cumsum(0), (1, 0)).to(torch.int32)
    picks = [(b, q_len - n + i) for b, n in enumerate(new.tolist()) for i in range(n)]
    q = torch.stack([batch.q[b, i] for b, i in picks])
    out, lse = mlakit.mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu_seqlens_q, max_q_len=2,
                                 **kwargs)
    lengths = batch.cache_seqlens.tolist()
    visible = [lengths[b] - q_len + i + 1 for b, i in picks]
    assert all(v > 0 for v in visible)
    expected = torch.stack([ref_out[b, i] for b, i in picks])
    expected_lse = torch.stack([ref_lse[b, :, i] for b, i in picks])
    assert relative_error(out, expected) < 1e-2
    assert_lse_close(lse, expected_lse, atol=1e-2, rtol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("heads, kv_dtype", [(16, "bf16"), (128, "bf16"), (128, "fp8_e4m3")])
@pytest.mark.parametrize("lengths, ragged", [([9000, 0, 4096, 1, 700, 16384, 65], True), ([8192] * 6, False)])
def test_persistent_kernel_takes_every_unit_and_leaves_its_counter_at_zero(heads, kv_dtype, lengths, ragged):
    from mlakit.kernels.triton_decode import plan_decode

    # Plans for far more programs than the GPU runs: several rounds of units, in snake order or (ragged)
    # taken from the plan's counter.
    batch = make_paged_batch(lengths, heads=heads, q_len=2, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=heads)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=heads, kv_dtype=batch.kv_cache.dtype, num_sms=1024)
    assert _split_kernel(batch, plan) == "hopper" and int(plan.work_state[2]) == ragged
    assert int(plan.work_state[0]) * plan.geometry.row_tiles > torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(heads)
    for _ in range(4):  # new queries each launch: a unit left out would keep the last launch's rows
        assert int(plan.work_state[1]) == 0, "every launch leaves the unit counter at zero"
        batch.q.copy_(torch.randn(batch.q.shape, device="cuda", generator=gen).to(batch.q.dtype))
        _check(batch, plan=plan)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("heads, q_len, copies, kv_dtype, kv_lora_rank, rope_dim", [
    (16, 1, 15, "bf16", 512, 64), (64, 3, 5, "bf16", 512, 64), (128, 2, 4, "bf16", 512, 64),
    (128, 2, 4, "fp8_e4m3", 512, 64), (128, 1, 8, "bf16", 256, 32), (16, 2, 15, "bf16", 128, 64)])
def test_persistent_kernel_merges_its_splits_and_leaves_its_counters_at_zero(heads, q_len, copies, kv_dtype,
                                                                             kv_lora_rank, rope_dim):
    """Batches that fill the GPU (a split ceiling of at most MERGE_MAX_SPLITS): the seesaw kernel merges
    the few split sequences' partials itself (no combine launch), at latent widths 512, 256 and 128, over several
    rounds of units taken dynamically (ragged batches)."""
    from mlakit.kernels.triton_decode import plan_decode

    lengths = [9000, 0, 4096, 1, 700, 16384, 65] * copies
    batch = make_paged_batch(lengths, heads=heads, q_len=q_len, page_size=64, kv_lora_rank=kv_lora_rank,
                             rope_dim=rope_dim, kv_dtype=kv_dtype, device="cuda", seed=heads + q_len + kv_lora_rank)
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype)
    assert int(plan.num_splits.max()) > 1 and int(plan.work_state[2]) == 1
    _check_merged_in_kernel(batch, plan, launches=3)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_persistent_kernel_merges_fixed_splits_taken_in_snake_order(kv_dtype):
    """A fixed 3-split plan (batch order, not ragged): several rounds in snake order, splits past short
    sequences' ends (empty partials) and empty sequences, all merged in kernel; units of 0, 1, 3, 4, 20, 22 and 47
    KV tiles one after another on a program."""
    from mlakit.kernels.triton_decode import DecodeTuning, plan_decode

    batch = make_paged_batch([9000, 0, 4096, 1, 700, 65] * 11, heads=128, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=5)
    plan = plan_decode(batch.cache_seqlens, q_len=1, heads=128, kv_dtype=batch.kv_cache.dtype,
                       tuning=DecodeTuning(64, 64, 8, programs_per_sm=1, fixed_splits=3))
    assert int(plan.work_state[2]) == 0
    _check_merged_in_kernel(batch, plan, launches=2)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("fixed_splits", [None, 2])
def test_next_unit_prefetch_changes_no_value(monkeypatch, fixed_splits):
    """fp8 pages at 128 heads x 2 tokens, several units a program in snake order (uniform lengths, or a fixed
    2-split plan over ragged ones with empty sequences and splits): the seesaw's L2 prefetch of each next unit,
    never, one or three tile pairs ahead (more than some units have), gives the same bits, and the reference's
    attention; the block table's unused entries hold garbage pages the prefetch must not ask for."""
    from mlakit.kernels.decode_split_plan import ORDER_TAKEN
    from mlakit.kernels.hopper_decode import dispatch
    from mlakit.kernels.triton_decode import DecodeTuning, plan_decode

    lengths = [1500] * 96 if fixed_splits is None else [3000, 0, 700, 64, 5000, 1, 129] * 10
    batch = make_paged_batch(lengths, heads=128, q_len=2, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype="fp8_e4m3", device="cuda", seed=len(lengths))
    tuning = None if fixed_splits is None else DecodeTuning(64, 64, 8, programs_per_sm=1, fixed_splits=fixed_splits)
    outputs = []
    for pairs in (0, 1, 3):
        monkeypatch.setattr(dispatch, "L2_PREFETCH_PAIRS_FP8", pairs)
        plan = plan_decode(batch.cache_seqlens, q_len=2, heads=128, kv_dtype=batch.kv_cache.dtype, tuning=tuning)
        assert int(plan.work_state[2]) != ORDER_TAKEN, "units in a fixed order: each program knows its next one"
        assert int(plan.work_state[0]) * plan.geometry.row_tiles > torch.cuda.get_device_properties(0).multi_processor_count
        assert _split_kernel(batch, plan) == "hopper"
        outputs.append(_check(batch, plan=plan))
    for out, lse in outputs[1:]:
        assert torch.equal(out, outputs[0][0]) and torch.equal(lse, outputs[0][1])


@pytest.fixture
def seesaw_ahead_flags(monkeypatch) -> list[bool]:
    """The `LEFT_SCORES_AHEAD` flag of each seesaw launch from now on, in order."""
    from mlakit.kernels.hopper_decode import dispatch

    launched = []
    seesaw = dispatch.SEESAW

    def recording_seesaw(key, grid, args, constants):
        launched.append(constants["LEFT_SCORES_AHEAD"])
        seesaw(key, grid, args, constants)

    monkeypatch.setattr(dispatch, "SEESAW", recording_seesaw)
    return launched


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("heads, q_len, kv_dtype", [(128, 2, "bf16"), (33, 3, "bf16"), (5, 8, "fp16"), (1, 1, "bf16"),
                                                    (64, 4, "fp16")])
@pytest.mark.parametrize("num_sms", [None, 8, 1024])
def test_left_scores_ahead_changes_no_value(monkeypatch, seesaw_ahead_flags, heads, q_len, kv_dtype, num_sms):
    """16-bit pages: the seesaw's warpgroup 0 issuing each next tile pair's left half of S behind its last P . V
    (`LEFT_SCORES_AHEAD`, here at any row-tile count) or at the pair's start gives the same bits, and the reference's
    attention: ragged lengths with an empty sequence, ends inside a tile (rows past them zeroed after a left half's S
    read them), pages in random order with garbage in the table's unused entries; plans for 8 SMs give units of 11 to
    47 tiles (many pairs, both stages reloaded while an S is in flight), for 1024 SMs splits of one or two tiles."""
    from mlakit.kernels.hopper_decode import dispatch
    from mlakit.kernels.triton_decode import plan_decode

    q_dtype = torch.float16 if kv_dtype == "fp16" else torch.bfloat16
    batch = make_paged_batch([3000, 0, 1, 63, 700, 130], heads=heads, q_len=q_len, page_size=64, kv_lora_rank=512,
                             rope_dim=64, kv_dtype=kv_dtype, q_dtype=q_dtype, device="cuda", seed=heads * q_len)
    outputs = []
    for min_row_tiles, ahead in ((1, True), (1 << 20, False)):
        monkeypatch.setattr(dispatch, "LEFT_SCORES_AHEAD_MIN_ROW_TILES", min_row_tiles)
        plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype,
                           num_sms=num_sms)
        assert _split_kernel(batch, plan) == "hopper"
        seesaw_ahead_flags.clear()
        outputs.append(_check(batch, plan=plan))
        assert seesaw_ahead_flags and set(seesaw_ahead_flags) == {ahead}
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("kv_tokens_hint, ahead", [(None, True), ("exact", False), (1 << 30, True)])
def test_the_plans_token_hint_turns_left_scores_ahead_off_for_short_units(seesaw_ahead_flags, kv_tokens_hint, ahead):
    """128 heads x 2 tokens over bf16 pages (4 row tiles): the seesaw issues the left half of S ahead unless the plan
    was told a batch of short units (this one's true token count: units of a few tiles); the reference's attention
    either way (ragged lengths with an empty sequence, pages in random order, garbage in unused table entries)."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([3000, 0, 1, 63, 700, 130], heads=128, q_len=2, page_size=64, kv_lora_rank=512,
                             rope_dim=64, kv_dtype="bf16", device="cuda", seed=7)
    hint = int(batch.cache_seqlens.sum()) if kv_tokens_hint == "exact" else kv_tokens_hint
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=128, kv_dtype=batch.kv_cache.dtype, kv_tokens_hint=hint)
    assert _split_kernel(batch, plan) == "hopper"
    _check(batch, plan=plan)
    assert seesaw_ahead_flags and set(seesaw_ahead_flags) == {ahead}


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("page_size", [64, 128])
def test_next_unit_prefetch_asks_for_the_units_rows(page_size):
    """The addresses `stage_next_unit` stages for each unit of a fixed 2-split plan (fp8 pages, 128 heads x 2
    tokens; empty sequences, splits past a sequence's end, pages in random order, garbage in the block table's
    unused entries): the unit's query rows, and the cache rows of its first two KV tiles in two-row pieces, each at
    the address the host computes from the plan and the block table; 0 for rows and tiles the unit does not have."""
    from mlakit.kernels.decode_split_plan import WORK_FIELDS
    from mlakit.kernels.triton_decode import DecodeTuning, plan_decode

    heads, q_len = 128, 2
    batch = make_paged_batch([3000, 0, 700, 64, 129, 1, 200], heads=heads, q_len=q_len, page_size=page_size,
                             kv_lora_rank=512, rope_dim=64, kv_dtype="fp8_e4m3", device="cuda", seed=page_size)
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=batch.kv_cache.dtype,
                       tuning=DecodeTuning(64, 64, 8, programs_per_sm=1, fixed_splits=2))
    q = batch.q.reshape(-1, heads, batch.q.shape[-1])
    pages = batch.kv_cache
    row_tiles, work_rows = plan.geometry.row_tiles, plan.work.shape[0]
    staged = torch.zeros(row_tiles * work_rows, PIECE_COUNT.value, dtype=torch.int64, device="cuda")
    _staged_pieces_kernel[(row_tiles * work_rows,)](
        staged, q, pages, batch.block_table, plan.work, batch.cache_seqlens, (q.stride(0), q.stride(1)),
        pages.stride(1), batch.block_table.stride(0), row_tiles, work_rows, HEADS=heads, PAGE_SIZE=page_size,
        num_warps=4)

    work, seqlens, table = plan.work.cpu().tolist(), batch.cache_seqlens.cpu().tolist(), batch.block_table.cpu()
    expected = torch.zeros_like(staged, device="cpu")
    for unit in range(row_tiles * work_rows):
        b, split, num_splits, first_token, rows, start, end = work[unit // row_tiles][:WORK_FIELDS]
        tile = unit % row_tiles
        if split >= num_splits or tile * 64 >= rows * heads:
            continue
        for piece, row in enumerate(range(tile * 64, min(tile * 64 + 64, rows * heads))):
            offset = (first_token + row // heads) * q.stride(0) + row % heads * q.stride(1)
            expected[unit, piece] = q.data_ptr() + offset * q.element_size()
        start = start // 64 * 64
        tiles = max(-(-(min(seqlens[b], end) - start) // 64), 0)
        for piece in range(64):
            kv_tile, token = piece // 32, start + piece // 32 * 64 + piece % 32 * 2
            if kv_tile < tiles:
                row = int(table[b, token // page_size]) * page_size + token % page_size
                expected[unit, 64 + piece] = pages.data_ptr() + row * pages.stride(1) * pages.element_size()
    assert (expected[:, :64] != 0).any() and (expected[:, 64:] != 0).any()
    assert torch.equal(staged.cpu(), expected)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("num_sms", [None, 1024])
@pytest.mark.parametrize("planned_lengths", [[65, 5000, 40000, 0, 700, 100, 9000], [64, 1, 4096, 0, 640, 16384, 9000]])
def test_persistent_kernel_with_a_plan_built_for_other_lengths(heads, num_sms, planned_lengths):
    """A plan reused after the lengths changed (longer, shorter, emptied, past the block table's pages,
    the same) splits the call's lengths badly but never wrongly: the seesaw kernel computes the call's
    attention, in one round of units or several."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([9000, 0, 4096, 1, 700, 16384, 65], heads=heads, q_len=2, page_size=64, kv_lora_rank=512,
                             rope_dim=64, device="cuda", seed=heads + len(planned_lengths))
    assert 40000 > batch.block_table.shape[1] * 64
    planned = torch.tensor(planned_lengths, dtype=torch.int32, device="cuda")
    plan = plan_decode(planned, q_len=2, heads=heads, kv_dtype=batch.kv_cache.dtype, num_sms=num_sms)
    assert _split_kernel(batch, plan) == "hopper"
    _check(batch, plan=plan)


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_a_few_long_sequences_at_128_heads_take_splits_of_several_waves(kv_dtype):
    """Planned for 33 SMs, 6 sequences of ~16k tokens at 128 heads x 2 tokens are 24 units in one wave; the plan
    gives each 4 splits (96 units in three waves of a quarter the tiles, NOTES.md v87), exactly."""
    from mlakit.kernels.triton_decode import plan_decode

    batch = make_paged_batch([16384] * 5 + [16000], heads=128, q_len=2, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=87)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=128, kv_dtype=batch.kv_cache.dtype, num_sms=33)
    assert plan.num_splits.tolist() == [4] * 6 and int(plan.work_state[2]) == 0
    assert _split_kernel(batch, plan) == "hopper"
    _check(batch, plan=plan)


@needs_share_plans
@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("kv_dtype, lengths, q_len, num_sms", [
    ("bf16", [8192] * 40, 2, 132),
    ("fp8_e4m3", [8192 + 97 * (i % 7) - 300 for i in range(40)], 2, 132),
    ("bf16", [16384] * 24, 1, 132),
    ("fp8_e4m3", [16000 + 131 * (i % 6) for i in range(24)], 1, 132),
    ("bf16", [8192 + 97 * (i % 7) - 300 for i in range(10)], 2, 32),
])
def test_equal_share_plans_at_128_heads(kv_dtype, lengths, q_len, num_sms, monkeypatch):
    """Planned for `num_sms` SMs with EQUAL_SHARES, these 128-head batches take equal shares (NOTES.md v88): sequences
    cut where a share ends, each share's pieces run one after another by its row tiles' programs. 40 sequences at
    two tokens have a split ceiling of 3: the seesaw merges the cut sequences itself, launch after launch; 24 at one
    token have 9: the combine kernel merges them. Planned for 32 SMs and launched on all of them, a plan's rows no
    longer keep each program on one share, but every unit still runs once."""
    from mlakit.kernels import decode_split_plan
    from mlakit.kernels.triton_decode import plan_decode

    monkeypatch.setattr(decode_split_plan, "EQUAL_SHARES", True)
    batch = make_paged_batch(lengths, heads=128, q_len=q_len, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=88)
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=128, kv_dtype=batch.kv_cache.dtype, num_sms=num_sms,
                       page_size=64)
    assert int(plan.work_state[2]) == decode_split_plan.ORDER_SHARES and int(plan.num_splits.max()) > 1
    assert _split_kernel(batch, plan) == "hopper"
    if q_len == 2 and num_sms == 132:  # several rounds of units on every SM, merged in the kernel
        _check_merged_in_kernel(batch, plan, launches=2)
    else:
        _check(batch, plan=plan)


@needs_share_plans
@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernels need an SM90 GPU")
@pytest.mark.parametrize("kv_dtype, page_size, sequences, q_len, num_sms", [
    ("bf16", 64, 24, 1, 32),  # a split ceiling of 2: the combine behind the seesaw merges the share plan
    ("fp8_e4m3", 64, 16, 2, 64),  # 3
    ("bf16", 64, 16, 1, 64),  # 6: the combine merges every plan
    ("bf16", 16, 16, 2, 64),  # pages of 16 tokens, planned for 64: the cp.async split kernel over the share plan
])
def test_ragged_batches_take_equal_shares_at_128_heads(kv_dtype, page_size, sequences, q_len, num_sms):
    """Ragged batches of 100-3000 tokens planned for `num_sms` SMs and the seesaw's pages take equal shares
    (RAGGED_EQUAL_SHARES, in the plan's enlarged rows: a share's short sequences run in rounds of their own) and match
    the reference launch after launch with fresh queries (the seesaw launched on every SM), also where the plan's page
    size was wrong (the cp.async kernel runs it). Planned for pages of 16 or without a page size, they keep their split
    counts in the split counts' rows."""
    from mlakit.kernels import decode_split_plan
    from mlakit.kernels.triton_decode import plan_decode

    lengths = torch.randint(100, 3001, (sequences,), generator=torch.Generator().manual_seed(0)).tolist()
    batch = make_paged_batch(lengths, heads=128, q_len=q_len, page_size=page_size, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=97)
    for other_pages in (16, None):
        split_counts = plan_decode(batch.cache_seqlens, q_len=q_len, heads=128, kv_dtype=batch.kv_cache.dtype,
                                   num_sms=num_sms, page_size=other_pages)
        assert int(split_counts.work_state[2]) == decode_split_plan.ORDER_TAKEN, other_pages
        assert split_counts.work.shape[0] == sequences * split_counts.geometry.max_splits, other_pages
    plan = plan_decode(batch.cache_seqlens, q_len=q_len, heads=128, kv_dtype=batch.kv_cache.dtype, num_sms=num_sms,
                       page_size=64)
    assert int(plan.work_state[2]) == decode_split_plan.ORDER_SHARES and int(plan.num_splits.max()) > 1
    assert plan.work.shape[0] == decode_split_plan.RAGGED_SHARE_ROWS * sequences * plan.geometry.max_splits
    assert _split_kernel(batch, plan) == "hopper"
    gen = torch.Generator(device="cuda").manual_seed(97)
    for _ in range(2):
        batch.q.copy_(torch.randn(batch.q.shape, device="cuda", generator=gen).to(batch.q.dtype))
        _check(batch, plan=plan)
        assert not plan.merge_state.any()


@needs_share_plans
@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernel needs an SM90 GPU")
@pytest.mark.parametrize("kv_dtype, lengths, q_len, shares, fixed_splits, planned_pages", [
    ("bf16", [8192] * 40, 2, True, None, 64),
    ("fp8_e4m3", [8192 + 97 * (i % 7) - 300 for i in range(40)], 2, True, None, 64),
    ("bf16", [9000, 0, 4096, 1, 700, 16384, 65] * 4, 2, False, None, 64),  # ragged: units taken as programs finish
    ("bf16", [9000, 0, 4096, 1, 700, 65] * 11, 1, False, 3, 64),  # three fixed splits a sequence in snake order
    ("bf16", [8192] * 40, 2, False, None, None),  # planned without the page size: no shares
])
def test_share_plans_merge_in_the_combine_and_other_plans_in_the_seesaw(kv_dtype, lengths, q_len, shares,
                                                                        fixed_splits, planned_pages):
    """With SHARE_MERGES_BY_COMBINE (the default), a split ceiling of at most MERGE_MAX_SPLITS and a plan that may
    take equal shares (planned for the seesaw's pages, with the Hopper tier's tile), a combine is launched behind
    the seesaw: over an equal-share plan the seesaw leaves its cut sequences' partials to it (with the combine's
    launch skipped, their rows keep what the output held), over other plans it merges them itself and the combine
    changes nothing; a plan that cannot take shares (fixed splits, no page size) launches no combine. Launch after
    launch with fresh queries, the merge counters at zero."""
    from mlakit.kernels import decode_split_plan, hopper_decode, triton_decode
    from mlakit.kernels.triton_decode import DecodeTuning, plan_decode

    assert hopper_decode.dispatch.SHARE_MERGES_BY_COMBINE
    batch = make_paged_batch(lengths, heads=128, q_len=q_len, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=32)
    tuning = fixed_splits and DecodeTuning(64, 64, 8, programs_per_sm=1, fixed_splits=fixed_splits)

    def new_plan():
        return plan_decode(batch.cache_seqlens, q_len=q_len, heads=128, kv_dtype=batch.kv_cache.dtype, tuning=tuning,
                           page_size=planned_pages)

    plan = new_plan()
    assert (int(plan.work_state[2]) == decode_split_plan.ORDER_SHARES) == shares and int(plan.num_splits.max()) > 1
    assert _split_kernel(batch, plan) == "hopper" and 1 < plan.geometry.max_splits <= hopper_decode.dispatch.MERGE_MAX_SPLITS
    combine = mock.Mock(wraps=triton_decode._COMBINE)
    gen = torch.Generator(device="cuda").manual_seed(32)
    with mock.patch.object(triton_decode, "_COMBINE", combine):
        for _ in range(2):
            batch.q.copy_(torch.randn(batch.q.shape, device="cuda", generator=gen).to(batch.q.dtype))
            _check(batch, plan=plan)
            assert not plan.merge_state.any(), "every launch leaves the merge counters at zero"
    assert plan.may_share == (fixed_splits is None and planned_pages == 64)
    assert combine.call_count == (2 if plan.may_share else 0)
    held = torch.full((*batch.q.shape[:3], batch.kv_lora_rank), float("nan"), dtype=batch.q.dtype, device="cuda")
    with mock.patch.object(triton_decode, "_COMBINE", mock.Mock()):
        out, _ = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                   kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale,
                                   kv_scale=batch.kv_scale, plan=new_plan(), out=held)
    split = (plan.num_splits > 1).nonzero().flatten().tolist()
    left = [b for b in split if out[b].isnan().all()]
    assert left == (split if shares else []), "the seesaw merges every split sequence but a share plan's"


@pytest.mark.skipif(not torch.cuda.is_available() or not _on_hopper(), reason="the Hopper kernels need an SM90 GPU")
@pytest.mark.parametrize("kv_dtype, page_size, heads, block_m, kernel", [
    ("bf16", 64, 128, 64, "hopper"),  # the persistent seesaw
    ("bf16", 16, 128, 64, "hopper"),  # the cp.async split kernel
    ("fp8_e4m3", 16, 128, 64, "hopper"),  # the fp8 split kernel
    ("fp8_e4m3", 64, 16, 16, "narrow"),
])
def test_hopper_kernels_read_each_splits_kv_range_from_the_plan(kv_dtype, page_size, heads, block_m, kernel):
    """Both splits of sequence 0 edited to cover all its tokens: the merged output stays, its lse grows by ln 2;
    sequence 1, untouched, keeps the reference's (as the portable kernel's CPU test)."""
    from mlakit.kernels.decode_split_plan import OPEN_KV_END
    from mlakit.kernels.triton_decode import DecodeTuning, plan_decode

    batch = make_paged_batch([3000, 1700], heads=heads, q_len=1, page_size=page_size, kv_lora_rank=512, rope_dim=64,
                             kv_dtype=kv_dtype, device="cuda", seed=heads + page_size)
    tuning = DecodeTuning(block_m, 64, 4 if block_m == 16 else 8, programs_per_sm=2 if block_m == 16 else 1,
                          fixed_splits=2)
    plan = plan_decode(batch.cache_seqlens, q_len=1, heads=heads, kv_dtype=batch.kv_cache.dtype, tuning=tuning)
    assert _split_kernel(batch, plan) == kernel
    plan.work[:2, 5] = 0
    plan.work[:2, 6] = OPEN_KV_END.value
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                 kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale,
                                 kv_scale=batch.kv_scale, plan=plan)
    ref_out, ref_lse = _reference(batch)
    fp8 = batch.kv_cache.dtype == torch.float8_e4m3fn
    assert relative_error(out, ref_out) < (3e-2 if fp8 else 1e-2)
    assert_lse_close(lse[0], ref_lse[0] + math.log(2), atol=3e-2 if fp8 else 1e-3)
    assert_lse_close(lse[1], ref_lse[1], atol=3e-2 if fp8 else 1e-3)


def _check_merged_in_kernel(batch, plan, launches):
    """`launches` calls of one plan with fresh queries each (a merge left out would keep the last launch's
    rows), in several rounds of units, the seesaw merging every plan (share plans too:
    SHARE_MERGES_BY_COMBINE off), with no combine launch (it would raise), the counters at zero after each."""
    from mlakit.kernels import hopper_decode, triton_decode

    assert _split_kernel(batch, plan) == "hopper"
    assert 1 < plan.geometry.max_splits <= hopper_decode.dispatch.MERGE_MAX_SPLITS
    assert int(plan.work_state[0]) * plan.geometry.row_tiles > torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(batch.q.shape[2])
    no_combine = mock.Mock(side_effect=AssertionError("the seesaw merges its splits itself: no combine launch"))
    with (mock.patch.object(triton_decode, "_COMBINE", no_combine),
          mock.patch.object(hopper_decode.dispatch, "SHARE_MERGES_BY_COMBINE", False)):
        for _ in range(launches):
            batch.q.copy_(torch.randn(batch.q.shape, device="cuda", generator=gen).to(batch.q.dtype))
            _check(batch, plan=plan)
            assert not plan.merge_state.any(), "every launch leaves the merge counters at zero"
