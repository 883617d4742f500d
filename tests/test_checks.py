"""mla_decode's input checks: every bad argument is named, with what was expected and what came."""

import pytest
import torch

import mlakit
from mlakit.errors import MLAInputError
from paged_inputs import make_paged_batch


def _batch():
    return make_paged_batch([20, 0, 7], heads=3, page_size=8, kv_lora_rank=512, rope_dim=64)


def _call(batch, **overrides):
    args = dict(
        q=batch.q, kv_cache=batch.kv_cache, block_table=batch.block_table, cache_seqlens=batch.cache_seqlens, kv_scale=batch.kv_scale
    )
    args.update(overrides)
    return mlakit.mla_decode(**args, softmax_scale=batch.softmax_scale)


@pytest.mark.parametrize(
    "override, pattern",
    [
        (lambda b: {"q": b.q[0]}, r"q: expected a 4-dimensional tensor"),
        (lambda b: {"q": b.q.float()}, r"q: expected dtype bfloat16 or float16, got torch.float32"),
        (lambda b: {"q": b.q[..., :100]}, r"kv_lora_rank: cannot infer it from q's last dim 100"),
        (lambda b: {"kv_cache": b.kv_cache[..., :500]}, r"kv_cache: expected last dim 576"),
        (lambda b: {"kv_cache": b.kv_cache.unsqueeze(2).expand(-1, -1, 2, -1)}, r"kv_cache: expected \[num_pages, page_size, dim\]"),
        (lambda b: {"kv_cache": b.kv_cache.float()}, r"kv_cache: expected dtype in"),
        (lambda b: {"block_table": b.block_table.long()}, r"block_table: expected dtype in \['torch.int32'\], got torch.int64"),
        (lambda b: {"block_table": b.block_table[:2]}, r"block_table: expected shape \[3, max_pages\]"),
        (lambda b: {"cache_seqlens": b.cache_seqlens[:2]}, r"cache_seqlens: expected shape \[3\]"),
        (lambda b: {"cache_seqlens": b.cache_seqlens.float()}, r"cache_seqlens: expected dtype"),
        (lambda b: {"kv_scale": torch.ones(1)}, r"kv_scale: expected None for a torch.bfloat16 cache"),
        (lambda b: {"cache_seqlens": torch.tensor([20, -1, 7], dtype=torch.int32)}, r"cache_seqlens: expected lengths >= 0, got cache_seqlens\[1\] = -1"),
        (
            lambda b: {"cache_seqlens": torch.tensor([20, 0, 25], dtype=torch.int32)},
            r"cache_seqlens: expected lengths <= max_pages \* page_size = 4 \* 8 = 32 .*got cache_seqlens\[2\] = 25|block_table: expected page indices",
        ),
        (lambda b: {"cache_seqlens": torch.tensor([20, 0, 33], dtype=torch.int32)}, r"a sequence longer than its pages"),
    ],
)
def test_bad_arguments_are_named(override, pattern):
    batch = _batch()
    with pytest.raises(MLAInputError, match=pattern):
        _call(batch, **override(batch))


def test_page_index_out_of_range_names_the_entry():
    batch = _batch()
    table = batch.block_table.clone()
    table[2, 0] = batch.kv_cache.shape[0]
    with pytest.raises(MLAInputError, match=r"block_table: expected page indices in \[0, \d+\) .*got block_table\[2, 0\] = \d+"):
        _call(batch, block_table=table)


def test_garbage_past_a_sequences_pages_is_not_an_error():
    batch = _batch()
    assert (batch.block_table < 0).any(), "the batch must carry garbage page indices in unused entries"
    out, lse = _call(batch)
    assert torch.isfinite(out.float()).all()


def test_device_mismatch_is_named():
    batch = _batch()
    meta = batch.block_table.to("meta")
    with pytest.raises(MLAInputError, match=r"block_table: expected a tensor on cpu \(the device of q\), got meta"):
        _call(batch, block_table=meta)


def test_fp8_cache_needs_a_well_formed_scale():
    batch = make_paged_batch([9, 4], heads=2, page_size=4, kv_lora_rank=512, rope_dim=64, kv_dtype="fp8_e4m3")
    with pytest.raises(MLAInputError, match=r"kv_scale: expected a float32 scale for the fp8 cache"):
        _call(batch, kv_scale=None)
    with pytest.raises(MLAInputError, match=r"kv_scale: expected one element or shape \[\d+, 4, 5\]"):
        _call(batch, kv_scale=torch.ones(3))


def test_check_inputs_false_skips_only_the_value_checks():
    batch = _batch()
    bad_lengths = torch.tensor([20, -1, 7], dtype=torch.int32)
    out, _ = mlakit.mla_decode(
        batch.q, batch.kv_cache, batch.block_table, bad_lengths, softmax_scale=batch.softmax_scale, check_inputs=False
    )
    assert out.shape == (3, 1, 3, 512)
    with pytest.raises(MLAInputError, match="block_table: expected dtype"):
        mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table.long(), batch.cache_seqlens, check_inputs=False)


def mla_decode_with_scale(batch, softmax_scale):
    return mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, softmax_scale=softmax_scale)


def _extend_call(softmax_scale):
    batch = make_paged_batch([9, 4], heads=2, page_size=4, kv_lora_rank=512, rope_dim=64)
    q = batch.q.view(2, 2, 576)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    return mlakit.mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, max_q_len=1, softmax_scale=softmax_scale)


def _prefill_call(softmax_scale):
    cache = torch.randn(4, 16, 576, dtype=torch.bfloat16)
    meta = mlakit.plan_prefill([5], [20], torch.tensor([[3, 1]], dtype=torch.int32), page_size=16)
    weight = torch.randn(2 * 256, 512, dtype=torch.bfloat16)
    return mlakit.mla_prefill(torch.randn(5, 2, 192, dtype=torch.bfloat16), cache, weight, meta, softmax_scale=softmax_scale)


def _forward_call(softmax_scale):
    from mlakit.serving.forward import mla_forward
    from mlakit.serving.step import AttentionStep

    step = AttentionStep((1, 2), (5, 2), torch.tensor([[0], [1]], dtype=torch.int32), torch.tensor([4, 8, 9]), page_size=8)
    return mla_forward(torch.randn(3, 2, 16), torch.randn(3, 2, 16), torch.randn(2, 8, 48), None, torch.randn(2 * 24, 32), step,
                       softmax_scale=softmax_scale)


SCALE_CALLS = {
    "mla_decode": lambda scale: mla_decode_with_scale(_batch(), scale),
    "mla_extend": _extend_call,
    "mla_prefill": _prefill_call,
    "mla_forward": _forward_call,
}


@pytest.mark.parametrize("entry", sorted(SCALE_CALLS))
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), 0.0, -0.125, True, "0.1"])
def test_softmax_scale_must_be_a_finite_positive_number(entry, scale):
    with pytest.raises(MLAInputError, match=r"softmax_scale: expected a finite number > 0"):
        SCALE_CALLS[entry](scale)


@pytest.mark.parametrize("entry", sorted(SCALE_CALLS))
def test_softmax_scale_accepts_python_and_numpy_numbers(entry):
    import numpy as np

    for scale in (0.125, 1, np.float32(0.125)):
        out = SCALE_CALLS[entry](scale)
        result = out[0] if isinstance(out, tuple) else out
        assert torch.isfinite(result.float()).all()


def _decode_args(**overrides):
    """check_decode_inputs' arguments for a small valid fp8 batch, with `overrides`."""
    batch = make_paged_batch([9, 4], heads=2, page_size=4, kv_lora_rank=64, rope_dim=16, kv_dtype="fp8_e4m3")
    args = dict(q=batch.q, kv_cache=batch.kv_cache, block_table=batch.block_table, cache_seqlens=batch.cache_seqlens,
                kv_scale=batch.kv_scale, kv_lora_rank=64)
    return args | overrides


@pytest.mark.parametrize(
    "override, pattern",
    [
        (lambda a: {"q": a["q"][:0]}, r"q: expected \[batch, q_len, heads, dim\] with batch, q_len and heads >= 1, got shape \(0,"),
        (lambda a: {"q": a["q"][:, :, :0]}, r"q: expected .* heads >= 1, got shape \(2, 1, 0, 80\)"),
        (lambda a: {"kv_cache": a["kv_cache"][:0]}, r"kv_cache: expected at least one page of at least one token, got shape \(0, 4, 80\)"),
        (lambda a: {"kv_cache": a["kv_cache"][:, :0]}, r"kv_cache: expected at least one page .*got shape \(\d+, 0, 80\)"),
        (lambda a: {"kv_lora_rank": 0}, r"kv_lora_rank: expected an integer in 1\.\.79 .*got 0"),
        (lambda a: {"kv_lora_rank": 80}, r"kv_lora_rank: expected an integer in 1\.\.79 .*got 80"),
        (lambda a: {"kv_lora_rank": 64.0}, r"kv_lora_rank: expected an integer in 1\.\.79 .*got 64\.0"),
        (lambda a: {"kv_scale": a["kv_scale"].double()}, r"kv_scale: expected a float32 tensor, got torch\.float64"),
        (lambda a: {"kv_scale": 0.5}, r"kv_scale: expected a float32 tensor, got float"),
        (lambda a: {"kv_scale": a["kv_scale"].to("meta")}, r"kv_scale: expected a tensor on cpu \(the device of q\), got meta"),
    ],
)
def test_every_decode_check_refuses_naming_the_argument(override, pattern):
    from mlakit.attention.checks import check_decode_inputs

    args = _decode_args()
    check_decode_inputs(**args)
    with pytest.raises(MLAInputError, match=pattern):
        check_decode_inputs(**(args | override(args)))


def test_extend_refuses_decreasing_cu_seqlens_q():
    """Offsets [0, 3, 1, 4]: first 0, last = q's 4 tokens, every segment <= max_q_len and <= its cache
    length, so only the non-decreasing check can catch the -2 segment."""
    from mlakit.attention.checks import check_extend_inputs

    batch = make_paged_batch([9, 4, 6], heads=2, page_size=4, kv_lora_rank=64, rope_dim=16)
    q = batch.q[:, 0].repeat(2, 1, 1)[:4]
    args = dict(q=q, kv_cache=batch.kv_cache, block_table=batch.block_table, cache_seqlens=batch.cache_seqlens,
                max_q_len=3, kv_scale=None, kv_lora_rank=64)
    check_extend_inputs(**args, cu_seqlens_q=torch.tensor([0, 1, 3, 4], dtype=torch.int32))
    with pytest.raises(MLAInputError, match=r"cu_seqlens_q: expected non-decreasing offsets, got \[0, 3, 1, 4\]"):
        check_extend_inputs(**args, cu_seqlens_q=torch.tensor([0, 3, 1, 4], dtype=torch.int32))


def _strided(tensor: torch.Tensor, garbage: int) -> torch.Tensor:
    """`tensor`'s values in a view whose last dim steps over a `garbage` element after each value."""
    wide = torch.full((*tensor.shape[:-1], 2 * tensor.shape[-1]), garbage, dtype=tensor.dtype)
    wide[..., ::2] = tensor
    return wide[..., ::2]


@pytest.mark.parametrize("argument, view, pattern", [
    ("block_table", lambda b: _strided(b.block_table, 10**6),
     r"block_table: expected a contiguous last dim \(stride 1: a sequence's page indices\), got strides \(\d+, 2\)"),
    ("cache_seqlens", lambda b: _strided(b.cache_seqlens, 0), r"cache_seqlens: expected a contiguous last dim .*got strides \(2,\)"),
    ("kv_cache", lambda b: b.kv_cache.transpose(1, 2).contiguous().transpose(1, 2),
     r"kv_cache: expected a contiguous last dim \(stride 1: a token's latent and rope values\)"),
])
def test_views_the_kernels_cannot_read_are_refused(argument, view, pattern):
    """Strided views whose values are right but whose memory holds other values between them (out-of-range page
    indices, in the block table's case): the kernels read the memory, so the view is refused, checks on or off."""
    batch = _batch()
    viewed = view(batch)
    assert torch.allclose(viewed, getattr(batch, argument), rtol=0, atol=0, equal_nan=True), "the same values"
    for check_inputs in (True, False):
        with pytest.raises(MLAInputError, match=pattern):
            mlakit.mla_decode(**{**dict(q=batch.q, kv_cache=batch.kv_cache, block_table=batch.block_table,
                                        cache_seqlens=batch.cache_seqlens), argument: viewed},
                              softmax_scale=batch.softmax_scale, check_inputs=check_inputs)


def test_extend_refuses_strided_offsets():
    batch = make_paged_batch([9, 4], heads=2, page_size=4, kv_lora_rank=512, rope_dim=64)
    offsets = _strided(torch.tensor([0, 1, 2], dtype=torch.int32), 7)
    with pytest.raises(MLAInputError, match=r"cu_seqlens_q: expected a contiguous last dim .*got strides \(2,\)"):
        mlakit.mla_extend(batch.q.view(2, 2, 576), batch.kv_cache, batch.block_table, batch.cache_seqlens, offsets,
                          max_q_len=1, softmax_scale=batch.softmax_scale)


@pytest.mark.parametrize("name", ["out", "lse"])
def test_expanded_outputs_are_refused(name):
    batch = _batch()
    expanded = {"out": torch.empty(3, 1, 1, 512, dtype=batch.q.dtype).expand(3, 1, 3, 512),
                "lse": torch.empty(3, 1, 1).expand(3, 3, 1)}[name]
    with pytest.raises(MLAInputError, match=rf"{name}: expected a \[.*\] tensor whose elements are distinct memory"):
        mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                          softmax_scale=batch.softmax_scale, **{name: expanded})


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0.0, -1.0])
def test_fp8_tensor_scale_must_be_finite_and_positive(scale):
    batch = make_paged_batch([9, 4], heads=2, page_size=4, kv_lora_rank=512, rope_dim=64, kv_dtype="fp8_e4m3")
    _call(batch)
    with pytest.raises(MLAInputError, match=r"kv_scale: expected a finite scale > 0 .*got"):
        _call(batch, kv_scale=torch.full((1,), scale))


@pytest.mark.parametrize("arguments, pattern", [
    (dict(cache_seqlens=[20, 3]), r"cache_seqlens: expected a torch.Tensor, got list"),
    (dict(cache_seqlens=torch.tensor(20, dtype=torch.int32)), r"cache_seqlens: expected 1 dimensions, got shape \(\)"),
    (dict(cache_seqlens=torch.zeros(0, dtype=torch.int32)), r"cache_seqlens: expected \[batch\] lengths with batch >= 1"),
    (dict(cache_seqlens=torch.tensor([20, 3])), r"cache_seqlens: expected dtype in \['torch.int32'\], got torch.int64"),
    (dict(q_len=0), r"q_len: expected an integer >= 1, got 0"),
    (dict(q_len=1.5), r"q_len: expected an integer >= 1, got 1.5"),
    (dict(heads=-3), r"heads: expected an integer >= 1, got -3"),
])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_decode_metadata_arguments_are_named(arguments, pattern, backend):
    call = dict(cache_seqlens=torch.tensor([20, 3], dtype=torch.int32), q_len=1, heads=4) | arguments
    with pytest.raises(MLAInputError, match=pattern):
        mlakit.mla_decode_metadata(call.pop("cache_seqlens"), backend=backend, **call)


@pytest.mark.parametrize("arguments, pattern", [
    (dict(cu_seqlens_q=[0, 2, 3]), r"cu_seqlens_q: expected a torch.Tensor, got list"),
    (dict(cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32)), r"cu_seqlens_q: expected \[3\] offsets \(batch \+ 1\)"),
    (dict(max_q_len=0), r"max_q_len: expected an integer >= 1, got 0"),
])
def test_extend_metadata_arguments_are_named(arguments, pattern):
    from mlakit.attention.functional import mla_extend_metadata

    call = dict(cu_seqlens_q=torch.tensor([0, 2, 3], dtype=torch.int32), max_q_len=2) | arguments
    with pytest.raises(MLAInputError, match=pattern):
        mla_extend_metadata(torch.tensor([20, 3], dtype=torch.int32), call.pop("cu_seqlens_q"), heads=4,
                            backend="reference", **call)


def _prefill_operands(kv_dtype: torch.dtype = torch.bfloat16):
    generator = torch.Generator().manual_seed(11)
    cache = torch.randn(4, 16, 576, generator=generator).to(kv_dtype)
    meta = mlakit.plan_prefill([5], [20], torch.tensor([[3, 1]], dtype=torch.int32), page_size=16)
    weight = torch.randn(2 * 256, 512, generator=generator).bfloat16()
    q = torch.randn(5, 2, 192, generator=generator).bfloat16()
    return q, cache, weight, meta


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_prefill_refuses_a_strided_query_checks_on_or_off(backend):
    """The layout checks run whatever `check_inputs` says: the prepared fast path reads q's memory directly."""
    q, cache, weight, meta = _prefill_operands()
    strided = torch.randn(5, 2, 384, dtype=torch.bfloat16)[..., ::2]
    for check_inputs in (True, False):
        with pytest.raises(MLAInputError, match=r"q: expected a contiguous last dim .*got strides \(768, 384, 2\)"):
            mlakit.mla_prefill(strided, cache, weight, meta, softmax_scale=0.1, backend=backend,
                               check_inputs=check_inputs)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0.0, -1.0])
def test_prefill_fp8_tensor_scale_must_be_finite_and_positive(scale):
    q, cache, weight, meta = _prefill_operands(torch.float8_e4m3fn)
    mlakit.mla_prefill(q, cache, weight, meta, softmax_scale=0.1, kv_scale=torch.ones(1))
    with pytest.raises(MLAInputError, match=r"kv_scale: expected a finite scale > 0 .*got"):
        mlakit.mla_prefill(q, cache, weight, meta, softmax_scale=0.1, kv_scale=torch.full((1,), scale))
