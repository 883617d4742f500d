"""mlakit.compat.flash_mla on the CPU (reference backend): FlashMLA's signatures, shapes, masking
and metadata styles, checked against a float64 oracle on fresh random paged data (shuffled pages,
NaN in every unused slot, garbage page indices past each sequence's pages)."""

from __future__ import annotations

import dataclasses
import re
from unittest import mock

import pytest
import torch

from mlakit.compat import flash_mla as compat
from mlakit.compat.flash_mla import flash_mla_with_kvcache, get_mla_metadata
from mlakit.errors import MLAInputError
from flash_mla_oracle import LENGTHS, assert_matches_oracle, run
from paged_inputs import PagedBatch, make_paged_batch

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("s_q", [1, 2, 4, 8])
def test_causal_and_full_masks_against_the_oracle(s_q, causal):
    batch = make_paged_batch(LENGTHS, heads=3, q_len=s_q, page_size=16, kv_lora_rank=512, rope_dim=64, seed=s_q)
    out, lse = run(batch, causal=causal)
    assert_matches_oracle(batch, out, lse, causal)


@pytest.mark.parametrize("heads, page_size", [(1, 1), (5, 7), (16, 64), (33, 128), (128, 32)])
def test_any_head_count_and_page_size(heads, page_size):
    batch = make_paged_batch([40, 0, 3], heads=heads, q_len=2, page_size=page_size, kv_lora_rank=512, rope_dim=64, seed=heads)
    assert_matches_oracle(batch, *run(batch, causal=True), causal=True)


@pytest.mark.parametrize("kv_dtype, page_size, scale_layout, hint", [
    ("bf16", 64, "tensor", 64), ("bf16", 32, "tensor", None), ("fp8_e4m3", 128, "tensor", 128),
    ("fp8_e4m3", 64, "group", None),
])
def test_the_schedule_is_planned_with_the_caches_page_size_hint(kv_dtype, page_size, scale_layout, hint):
    """The first call fills the schedule with metadata planned with `decode_page_size_hint` of its cache: the page
    size where the persistent kernel reads the pages (whole 64-token tiles, bf16 or fp8 with one scale), else None."""
    batch = make_paged_batch([40, 0, 3], heads=4, q_len=1, page_size=page_size, kv_lora_rank=512, rope_dim=64, seed=3,
                             kv_dtype=kv_dtype, scale_layout=scale_layout)
    with mock.patch.object(compat, "mla_decode_metadata", wraps=compat.mla_decode_metadata) as build:
        assert_matches_oracle(batch, *run(batch, causal=True), causal=True)
    assert build.call_args.kwargs["page_size"] == hint


def test_a_layout_with_per_group_scales_is_not_the_per_tensor_layout():
    """The remembered verdicts tell per-tensor from per-group scales, so each plans with its own page-size hint."""
    compat._CALL_LAYOUTS.clear()
    hints = []
    for layout in ("tensor", "group"):
        batch = make_paged_batch([40, 3], heads=4, q_len=1, page_size=64, kv_lora_rank=512, rope_dim=64, seed=5,
                                 kv_dtype="fp8_e4m3", scale_layout=layout)
        with mock.patch.object(compat, "mla_decode_metadata", wraps=compat.mla_decode_metadata) as build:
            assert_matches_oracle(batch, *run(batch, causal=True), causal=True)
        hints.append(build.call_args.kwargs["page_size"])
    assert hints == [64, None] and len(compat._CALL_LAYOUTS) == 2


@pytest.mark.parametrize("q_dtype", [torch.float16, torch.bfloat16])
def test_fp16_and_bf16(q_dtype):
    batch = make_paged_batch(LENGTHS, heads=4, q_len=2, kv_lora_rank=512, rope_dim=64, kv_dtype="fp16" if q_dtype == torch.float16 else "bf16", q_dtype=q_dtype)
    assert_matches_oracle(batch, *run(batch, causal=True), causal=True)


@pytest.mark.parametrize("layout", ["tensor", "group"])
def test_fp8_cache_with_kv_scale(layout):
    batch = make_paged_batch(LENGTHS, heads=4, q_len=2, kv_lora_rank=512, rope_dim=64, kv_dtype="fp8_e4m3", scale_layout=layout)
    assert_matches_oracle(batch, *run(batch, causal=True), causal=True)


def test_other_latent_widths_through_head_dim_v():
    batch = make_paged_batch([33, 2], heads=4, q_len=2, kv_lora_rank=256, rope_dim=32)
    assert_matches_oracle(batch, *run(batch, causal=True), causal=True)


def test_defaults_softmax_scale_and_cache_without_head_axis():
    batch = make_paged_batch([33, 2], heads=4, kv_lora_rank=512, rope_dim=64)
    batch = dataclasses.replace(batch, softmax_scale=576**-0.5)
    out, lse = flash_mla_with_kvcache(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, 512, *get_mla_metadata())
    assert_matches_oracle(batch, out, lse, causal=False)


OLDER_FORMS = {
    "current": lambda lengths, rows: get_mla_metadata(),
    "first release": lambda lengths, rows: get_mla_metadata(lengths, rows, 1),
    "first release, keywords": lambda lengths, rows: get_mla_metadata(cache_seqlens=lengths, num_heads_per_head_k=rows, num_heads_k=1),
    "sparse-era release": lambda lengths, rows: get_mla_metadata(lengths, rows, 1, num_heads_q=rows // 2, is_fp8_kvcache=False, topk=None),
}


@pytest.mark.parametrize("form", sorted(OLDER_FORMS))
def test_every_metadata_call_form_serves_every_layer(form):
    """Three layers (own caches and queries, the same lengths and pages) share one schedule,
    whose metadata is built by the first call only."""
    layers = [make_paged_batch(LENGTHS, heads=6, q_len=2, kv_lora_rank=512, rope_dim=64, seed=layer) for layer in range(3)]
    schedule = OLDER_FORMS[form](layers[0].cache_seqlens, 2 * 6)
    with mock.patch.object(compat, "mla_decode_metadata", wraps=compat.mla_decode_metadata) as build:
        for batch in layers:
            assert_matches_oracle(batch, *run(batch, schedule, causal=True), causal=True)
    assert build.call_count == 1
    assert schedule[0].have_initialized and schedule[0].metadata.backend == "reference"


def test_cpu_calls_check_values_by_default_and_can_skip_them():
    batch = make_paged_batch([70, 3], heads=2, kv_lora_rank=512, rope_dim=64)
    batch.cache_seqlens[1] = 1000
    with pytest.raises(MLAInputError, match="cache_seqlens"):
        run(batch)
    with mock.patch.object(compat, "mla_decode", wraps=compat.mla_decode) as decode:
        batch.cache_seqlens[1] = 3
        run(batch, check_inputs=False)
    assert decode.call_args.kwargs["check_inputs"] is False


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(causal=False), "reused for"),
        (dict(q_len=1), "reused for"),
        (dict(heads=3), "reused for"),
        (dict(kv_dtype="fp16", q_dtype=torch.float16), "reused for"),
    ],
)
def test_reusing_a_schedule_for_another_layout_raises(change, message):
    causal = change.pop("causal", True)
    first = make_paged_batch([9, 4], heads=4, q_len=2, kv_lora_rank=512, rope_dim=64)
    other = make_paged_batch([9, 4], **{**dict(heads=4, q_len=2, kv_lora_rank=512, rope_dim=64), **change})
    schedule = get_mla_metadata()
    run(first, schedule, causal=True)
    with pytest.raises(MLAInputError, match=f"tile_scheduler_metadata: filled for .* {message}"):
        run(other, schedule, causal=causal)


@pytest.mark.parametrize(
    "declared, message",
    [
        (lambda n: get_mla_metadata(n, 7, 1), "num_q_tokens_per_head_k: get_mla_metadata got 7"),
        (lambda n: get_mla_metadata(n, 8, 1, num_heads_q=2), "num_heads_q: get_mla_metadata got 2"),
        (lambda n: get_mla_metadata(n, 8, 1, is_fp8_kvcache=True), "is_fp8_kvcache: get_mla_metadata got True"),
        (lambda n: get_mla_metadata(n[:1], 8, 1), "cache_seqlens: get_mla_metadata got 1 lengths"),
        (lambda n: get_mla_metadata(n.to("meta"), 8, 1), "cache_seqlens: get_mla_metadata got them on meta"),
    ],
)
def test_first_call_is_checked_against_what_the_older_form_declared(declared, message):
    batch = make_paged_batch([9, 4], heads=4, q_len=2, kv_lora_rank=512, rope_dim=64)
    with pytest.raises(MLAInputError, match=message):
        run(batch, declared(batch.cache_seqlens), causal=True)


UNSUPPORTED = ["indices", "attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length"]


@pytest.mark.parametrize("argument", UNSUPPORTED)
def test_unsupported_arguments_raise_naming_them(argument):
    batch = make_paged_batch([9], heads=2, kv_lora_rank=512, rope_dim=64)
    with pytest.raises(MLAInputError, match=f"{argument}: not supported by mlakit.compat.flash_mla"):
        run(batch, **{argument: torch.zeros(1, dtype=torch.int32)})


def test_packed_fp8_layout_raises_naming_it():
    batch = make_paged_batch([9], heads=2, kv_lora_rank=512, rope_dim=64)
    packed = torch.zeros(4, 64, 1, 656, dtype=torch.float8_e4m3fn)
    with pytest.raises(MLAInputError, match="is_fp8_kvcache: .*packed 656-byte fp8 layout.*kv_scale="):
        flash_mla_with_kvcache(batch.q, packed, batch.block_table, batch.cache_seqlens, 512, *get_mla_metadata(), is_fp8_kvcache=True)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda b: get_mla_metadata(b.cache_seqlens, 2, 1, topk=2048), "topk: not supported"),
        (lambda b: get_mla_metadata(b.cache_seqlens, 2, 2), "num_heads_k: expected 1"),
        (lambda b: get_mla_metadata(b.cache_seqlens, 2), "the older call form needs all three"),
        (lambda b: get_mla_metadata(b.cache_seqlens.long(), 2, 1), "cache_seqlens: expected an int32 tensor"),
        (lambda b: get_mla_metadata(b.cache_seqlens, 2, 1, num_heads_per_head_k=2), "pass one of them, got both"),
        (lambda b: get_mla_metadata(num_heads_k=1), "cache_seqlens: the older call form"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 512, *torch_metadata(b)),
         "tile_scheduler_metadata: expected the first item of the pair from mlakit.compat.flash_mla.get_mla_metadata"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 512, get_mla_metadata()[0],
                                          torch.zeros(2, dtype=torch.int32)), "num_splits: expected None"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), None, b.cache_seqlens, 512, *get_mla_metadata()),
         "block_table: required for dense decode"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2).expand(-1, -1, 2, -1), b.block_table, b.cache_seqlens, 512,
                                          *get_mla_metadata()), "k_cache: expected one KV head"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 512, *get_mla_metadata(),
                                          is_fp8_kvcache=True), "is_fp8_kvcache: got True for a torch.bfloat16 cache"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2).to(torch.float8_e4m3fn), b.block_table, b.cache_seqlens, 512,
                                          *get_mla_metadata()), "pass is_fp8_kvcache=True"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2).to(torch.float8_e4m3fn), b.block_table, b.cache_seqlens, 512,
                                          *get_mla_metadata(), is_fp8_kvcache=True), "kv_scale: required with an fp8 cache"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2).to(torch.float8_e4m3fn), b.block_table, b.cache_seqlens, 512,
                                          *get_mla_metadata(), is_fp8_kvcache=True, kv_scale=0.5),
         "kv_scale: expected a float32 tensor .*, got 0.5"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 512.0, *get_mla_metadata()),
         "head_dim_v: expected an integer"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 576, *get_mla_metadata()),
         r"^head_dim_v: expected an integer in 1..575 .*, got 576$"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2).float(), b.block_table, b.cache_seqlens, 512,
                                          *get_mla_metadata()), "^k_cache: expected dtype bfloat16, float16 or float8_e4m3fn"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2)[..., :575], b.block_table, b.cache_seqlens, 512,
                                          *get_mla_metadata()), r"^k_cache: expected last dim d = 576 \(q's\)"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 512, *get_mla_metadata(),
                                          causal="False"), "^causal: expected a bool, got 'False'$"),
        (lambda b: flash_mla_with_kvcache(b.q, b.kv_cache.unsqueeze(2), b.block_table, b.cache_seqlens, 512, *get_mla_metadata(),
                                          check_inputs="x"), "^check_inputs: expected None or a bool, got 'x'$"),
        (lambda b: get_mla_metadata(b.cache_seqlens, 4.0, 1), "^num_q_tokens_per_head_k: expected an integer >= 1, got 4.0$"),
        (lambda b: get_mla_metadata(b.cache_seqlens, num_heads_k=1, num_heads_per_head_k=0),
         "^num_heads_per_head_k: expected an integer >= 1, got 0$"),
        (lambda b: get_mla_metadata(b.cache_seqlens, 2, 1, is_fp8_kvcache="yes"),
         "^is_fp8_kvcache: expected a bool, got 'yes'$"),
    ],
)
def test_bad_calls_raise_naming_the_argument(call, message):
    batch = make_paged_batch([9, 4], heads=2, kv_lora_rank=512, rope_dim=64)
    with pytest.raises(MLAInputError, match=message):
        call(batch)


def test_a_refused_first_call_leaves_the_schedule_for_the_corrected_one():
    """The first call fills the schedule; when mlakit refuses it (lengths for another batch here), the schedule stays
    empty, so the corrected call plans from its own lengths instead of failing against the refused call's."""
    batch = make_paged_batch([9, 4], heads=2, kv_lora_rank=512, rope_dim=64)
    schedule, num_splits = get_mla_metadata()
    cache = batch.kv_cache.unsqueeze(2)
    with pytest.raises(MLAInputError, match=r"^cache_seqlens: expected shape \[1\] \(batch of q\), got shape \(2,\)"):
        flash_mla_with_kvcache(batch.q[:1], cache, batch.block_table[:1], batch.cache_seqlens, 512, schedule, num_splits)
    assert not schedule.have_initialized
    out, _ = flash_mla_with_kvcache(batch.q[:1], cache, batch.block_table[:1], batch.cache_seqlens[:1], 512, schedule,
                                    num_splits)
    want, _ = flash_mla_with_kvcache(batch.q[:1], cache, batch.block_table[:1], batch.cache_seqlens[:1], 512,
                                     *get_mla_metadata())
    assert schedule.have_initialized and torch.equal(out, want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, axis", [((2, 0, 4, 576), "s_q"), ((2, 2, 0, 576), "h_q"), ((0, 1, 4, 576), "batch")])
def test_an_empty_query_axis_raises_naming_the_shape_q_came_in(shape, axis, causal):
    """q's own shape, not the one mlakit's kernel would get (s_q folded into the heads)."""
    batch = make_paged_batch([9, 4], heads=4, kv_lora_rank=512, rope_dim=64)
    message = re.escape(f"q: expected [batch, s_q, h_q, d] with {axis} >= 1, got shape {shape}")
    with pytest.raises(MLAInputError, match=f"^{message}$"):
        flash_mla_with_kvcache(torch.zeros(shape, dtype=torch.bfloat16), batch.kv_cache.unsqueeze(2), batch.block_table,
                               batch.cache_seqlens, 512, *get_mla_metadata(), causal=causal)


def torch_metadata(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """What the flash_mla package's older get_mla_metadata returned: two int32 tensors."""
    return torch.zeros(132, 8, dtype=torch.int32), torch.zeros(batch.q.shape[0] + 1, dtype=torch.int32)



@pytest.mark.parametrize("s_q, causal", [(1, False), (2, True), (2, False)])
def test_lse_turns_only_minus_inf_into_plus_inf_and_is_contiguous(s_q, causal):
    """mla_decode's lse (stubbed with NaN, +-inf and finite values) comes back with -inf as +inf and
    everything else as it was, contiguous, whether or not the query tokens were folded into the heads."""
    batch = make_paged_batch([9, 4], heads=2, q_len=s_q, kv_lora_rank=512, rope_dim=64)
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, -3.5, 7.25])
    expected = specials.repeat(2)[: 2 * 2 * s_q].view(2, 2, s_q)  # [b, h_q, s_q]
    folded = not causal and s_q > 1

    def stub(query, *args, kv_lora_rank, **kwargs):
        rows, q_len, heads, _ = query.shape
        lse = expected.transpose(1, 2).reshape(rows, heads, q_len) if folded else expected.clone()
        return torch.zeros(rows, q_len, heads, kv_lora_rank, dtype=query.dtype), lse

    with mock.patch.object(compat, "mla_decode", stub):
        out, lse = run(batch, causal=causal)
    assert out.shape == (2, s_q, 2, 512) and lse.shape == (2, 2, s_q) and lse.is_contiguous()
    want = expected.masked_fill(expected == float("-inf"), float("inf"))
    numbers = ~want.isnan()
    assert torch.equal(lse.isnan(), ~numbers)
    assert torch.equal(lse[numbers], want[numbers]) and torch.equal(lse[numbers].signbit(), want[numbers].signbit())


def test_checks_run_once_per_layout_and_again_for_a_new_one():
    layers = [make_paged_batch([9, 4], heads=4, q_len=2, kv_lora_rank=512, rope_dim=64, seed=seed) for seed in range(3)]
    schedule = get_mla_metadata()
    compat._CALL_LAYOUTS.clear()
    with mock.patch.object(compat, "_check_call", wraps=compat._check_call) as check:
        for batch in layers:
            assert_matches_oracle(batch, *run(batch, schedule, causal=True), causal=True)
        assert check.call_count == 1
        with pytest.raises(MLAInputError, match="is_fp8_kvcache: got True for a torch.bfloat16 cache"):
            batch = layers[0]
            flash_mla_with_kvcache(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, 512, *schedule,
                                   causal=True, is_fp8_kvcache=True)
        with pytest.raises(MLAInputError, match="reused for"):
            run(layers[0], schedule, causal=False)
        assert check.call_count == 3


def test_arguments_of_other_types_are_checked_every_call():
    """A NumPy head_dim_v or an int causal works as before, without a remembered verdict."""
    numpy = pytest.importorskip("numpy")
    batch = make_paged_batch([9, 4], heads=4, q_len=2, kv_lora_rank=512, rope_dim=64)
    compat._CALL_LAYOUTS.clear()
    for _ in range(2):
        out, lse = flash_mla_with_kvcache(batch.q, batch.kv_cache.unsqueeze(2), batch.block_table, batch.cache_seqlens,
                                          numpy.int64(512), *get_mla_metadata(), softmax_scale=batch.softmax_scale, causal=1)
        assert_matches_oracle(batch, out, lse, causal=True)
    assert not compat._CALL_LAYOUTS
    with pytest.raises(MLAInputError, match="head_dim_v: expected an integer"):
        flash_mla_with_kvcache(batch.q, batch.kv_cache.unsqueeze(2), batch.block_table, batch.cache_seqlens, 512.0,
                               *get_mla_metadata())
