"""Fuzz of the attention calls (mla_decode, mla_extend, plan_prefill + mla_prefill) with malformed
inputs: each probe ends in an mlakit error naming the mutated argument, or in the result the
unmutated call (or the float64 oracle) gives; the cache is never changed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_outcomes import FUZZ, assert_unchanged, probe, snapshot
from fuzz_strategies import (
    NOT_A_BACKEND,
    NOT_A_POSITIVE_NUMBER,
    NOT_AN_INT,
    Expect,
    Mutation,
    paged_batches,
    tensor_mutations,
    count_entry_mutation,
    valid_value_mutation,
    value_mutation,
)
from paged_inputs import PagedBatch, assert_lse_close, naive_attention, naive_decode, relative_error, sequence_keys
from mlakit import MLAInputError, mla_decode, mla_decode_metadata, mla_extend, mla_prefill, plan_prefill
from mlakit.cache.kv_quant import FP8_DTYPE

CACHE_DTYPES = (torch.bfloat16, torch.float16, FP8_DTYPE)
QUERY_DTYPES = (torch.bfloat16, torch.float16)
TARGETS = [pytest.param("cpu", "reference", id="cpu-reference"),
           pytest.param("cuda", "triton", id="cuda-triton", marks=pytest.mark.gpu)]
EXAMPLES_PER_MUTATION = 4


def _paged_kwargs(batch: PagedBatch, backend: str, device: str) -> dict[str, Any]:
    return dict(kv_cache=batch.kv_cache.to(device), block_table=batch.block_table.to(device),
                cache_seqlens=batch.cache_seqlens.to(device), kv_scale=None if batch.kv_scale is None else batch.kv_scale.to(device),
                kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, backend=backend)


def _batch_of(kwargs: dict[str, Any], q: torch.Tensor) -> PagedBatch:
    return PagedBatch(q.cpu(), kwargs["kv_cache"].cpu(), kwargs["block_table"].cpu(), kwargs["cache_seqlens"].cpu(),
                      None if kwargs["kv_scale"] is None else kwargs["kv_scale"].cpu(), kwargs["kv_lora_rank"], kwargs["softmax_scale"])


def _close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float = 2e-2) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert relative_error(actual, expected) < tolerance


# --- mutations shared by every paged call (kv_cache, block_table, cache_seqlens, kv_scale, scalars) ---


def _used_page_out_of_range(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    lengths, table, page_size = kw["cache_seqlens"].tolist(), kw["block_table"].clone(), kw["kv_cache"].shape[1]
    read = kw.get("new_tokens", lengths)  # a prefill reads no page of a sequence without new tokens
    used = [(b, p) for b, (n, new) in enumerate(zip(lengths, read)) if new for p in range(-(-n // page_size))]
    if not used:
        return _padding_columns(draw, kw)
    b, p = draw(st.sampled_from(used))
    table[b, p] = draw(st.sampled_from([-1, kw["kv_cache"].shape[0], 2**31 - 1, -(2**31)]))
    kw["block_table"] = table
    return "error"


def _padding_columns(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    table = kw["block_table"]
    garbage = torch.full((table.shape[0], draw(st.integers(1, 3))), draw(st.sampled_from([-7, 10**6])), dtype=table.dtype, device=table.device)
    kw["block_table"] = torch.cat([table, garbage], dim=1)
    return "same"


def _resize_rows(argument: str) -> Mutation:
    def apply(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
        tensor = kw[argument]
        kw[argument] = tensor[:-1] if draw(st.booleans()) else torch.cat([tensor, tensor[-1:]])
        return "error"

    return Mutation(f"{argument} rows", (argument,), apply)


def _negative_length(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    lengths = kw["cache_seqlens"].clone()
    lengths[draw(st.integers(0, lengths.shape[0] - 1))] = draw(st.sampled_from([-1, -(2**31)]))
    kw["cache_seqlens"] = lengths
    return "error"


def _longer_than_its_pages(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    lengths = kw["cache_seqlens"].clone()
    b = draw(st.integers(0, lengths.shape[0] - 1))
    page_size = kw["kv_cache"].shape[1]
    lengths[b] = draw(st.integers(-(-int(lengths[b]) // page_size) * page_size + 1, 2**31 - 1))
    kw["cache_seqlens"] = lengths
    return "error"


def _scale_for_the_wrong_cache(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    scale = kw["kv_scale"]
    if scale is None:
        kw["kv_scale"] = torch.ones(1, device=kw["kv_cache"].device)
    else:
        kw["kv_scale"] = draw(st.sampled_from([None, scale.double(), scale.flatten()[:1].expand(2), scale.tolist()]))
    return "error"


def _flashmla_view(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    kw["kv_cache"] = kw["kv_cache"].unsqueeze(2)
    return "same"


PAGED_MUTATIONS = [
    *tensor_mutations("kv_cache", CACHE_DTYPES, blamed=("kv_scale", "kv_cache_dtype")),
    *tensor_mutations("block_table", (torch.int32,)),
    *tensor_mutations("cache_seqlens", (torch.int32,)),
    _resize_rows("block_table"),
    _resize_rows("cache_seqlens"),
    Mutation("used page out of range", ("block_table",), _used_page_out_of_range),
    Mutation("garbage padding columns", ("block_table",), _padding_columns),
    Mutation("negative length", ("cache_seqlens",), _negative_length),
    Mutation("length past its pages", ("cache_seqlens", "block_table"), _longer_than_its_pages),
    Mutation("kv_scale for the wrong cache", ("kv_scale",), _scale_for_the_wrong_cache),
    Mutation("FlashMLA [.., 1, ..] cache view", (), _flashmla_view),
    value_mutation("softmax_scale", NOT_A_POSITIVE_NUMBER),
    value_mutation("kv_lora_rank", st.sampled_from([0, -1, 48, 49, 1000]) | NOT_AN_INT),
    value_mutation("backend", NOT_A_BACKEND),
]


def _query_mutations(ndim: int) -> list[Mutation]:
    def empty_axis(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
        axis = draw(st.integers(1 if ndim == 3 else 0, ndim - 2))
        kw["q"] = kw["q"].narrow(axis, 0, 0)
        return "error"

    def wider_rows(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
        q = kw["q"]
        kw["q"] = torch.cat([q, q[..., :1]], dim=-1) if draw(st.booleans()) else q[..., :-1]
        return "error"

    def strided(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
        kw["q"] = torch.stack([kw["q"], torch.zeros_like(kw["q"])], dim=-2).select(-2, 0)
        return "same"

    return [
        *tensor_mutations("q", QUERY_DTYPES),
        Mutation("q empty axis", ("q",), empty_axis),
        Mutation("q row width", ("q", "kv_cache", "kv_lora_rank"), wider_rows),
        Mutation("q strided view", (), strided),
    ]


def _fuzz_each(mutations: list[Mutation], **cases: st.SearchStrategy[Any]):
    """Parametrizes a test over the targets and `mutations`, each with EXAMPLES_PER_MUTATION drawn
    `cases` and a `data` strategy for the mutation's own draws."""

    def decorate(test):
        test = settings(FUZZ, max_examples=EXAMPLES_PER_MUTATION)(given(data=st.data(), **cases)(test))
        test = pytest.mark.parametrize("mutation", mutations, ids=lambda m: m.label)(test)
        return pytest.mark.parametrize("device, backend", TARGETS)(test)

    return decorate


def _run_probe(entry: str, mutation: Mutation, draw: st.DrawFn, kwargs: dict[str, Any], call, oracle=None) -> None:
    """Applies `mutation` to a copy of `kwargs` and probes `call(**mutated)` against its expectation."""
    mutated = dict(kwargs)
    expect = mutation.apply(draw, mutated)
    cache = kwargs["kv_cache"]
    before = snapshot(cache, kwargs["kv_scale"], kwargs["block_table"], kwargs["cache_seqlens"])
    if expect == "error":
        probe(entry, mutation.blamed, lambda: call(**mutated))
    else:
        reference = call(**kwargs) if expect == "same" else oracle(mutated)
        probe(entry, None, lambda: call(**mutated), lambda result: _assert_same(result, reference))
    assert_unchanged(before, cache, kwargs["kv_scale"], kwargs["block_table"], kwargs["cache_seqlens"])


def _assert_same(result: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    _close(result[0], expected[0].to(result[0].dtype))
    assert_lse_close(result[1], expected[1], atol=2e-2)


# --- mla_decode ---


def _decode_oracle(kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return naive_decode(_batch_of(kwargs, kwargs["q"]))


def _shorter(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    lengths = kw["cache_seqlens"].clone()
    b = draw(st.integers(0, lengths.shape[0] - 1))
    offsets = kw.get("cu_seqlens_q")
    new = 0 if offsets is None else int(offsets[b + 1] - offsets[b])  # an extend's new tokens stay in the cache
    lengths[b] = draw(st.integers(new, int(lengths[b])))
    kw["cache_seqlens"] = lengths
    return "oracle"


def _another_scale(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    kw["softmax_scale"] = draw(st.sampled_from([0.01, 0.5, 1, 3]))
    return "oracle"


def _stale_metadata(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    lengths = kw["cache_seqlens"]
    other = torch.cat([lengths, lengths[:1]]) if draw(st.booleans()) else lengths
    kw["metadata"] = draw(st.sampled_from([
        "metadata", 1,
        mla_decode_metadata(other, q_len=kw["q"].shape[1] + 1, heads=kw["q"].shape[2], backend="reference"),
    ]))
    return "error"


ORACLE_MUTATIONS = [Mutation("shorter length", (), _shorter), Mutation("another softmax_scale", (), _another_scale)]
DECODE_MUTATIONS = [
    *PAGED_MUTATIONS,
    *ORACLE_MUTATIONS,
    *_query_mutations(4),
    Mutation("stale or foreign metadata", ("metadata",), _stale_metadata),
]


@_fuzz_each(DECODE_MUTATIONS, batch=paged_batches())
def test_fuzz_mla_decode(device, backend, batch, mutation, data):
    kwargs = _paged_kwargs(batch, backend, device) | {"q": batch.q.to(device)}
    _run_probe("mla_decode", mutation, data.draw, kwargs, mla_decode, _decode_oracle)


# --- mla_extend ---


@st.composite
def _extend_cases(draw: st.DrawFn) -> tuple[PagedBatch, list[int]]:
    batch = draw(paged_batches(q_len=1))
    lengths = batch.cache_seqlens.tolist()
    new = [draw(st.integers(0, min(n, 5))) for n in lengths]
    dim = batch.q.shape[-1]
    q = torch.randn(sum(new), batch.q.shape[2], dim, generator=torch.Generator().manual_seed(sum(lengths))).to(batch.q.dtype)
    return dataclasses.replace(batch, q=q), new


def _naive_extend(kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    q, offsets = kwargs["q"].cpu(), kwargs["cu_seqlens_q"].tolist()
    batch = _batch_of(kwargs, q)
    out = torch.zeros(q.shape[0], q.shape[1], batch.kv_lora_rank, dtype=torch.float64)
    lse = torch.zeros(q.shape[0], q.shape[1], dtype=torch.float64)
    for b, (start, end) in enumerate(zip(offsets, offsets[1:])):
        keys = sequence_keys(batch, b)
        for i in range(end - start):
            out[start + i], lse[start + i] = naive_attention(q[start + i], keys[: keys.shape[0] - (end - start) + i + 1],
                                                             batch.kv_lora_rank, batch.softmax_scale)
    return out, lse


def _offsets_edit(edit):
    def apply(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
        offsets = kw["cu_seqlens_q"].clone()
        edit(draw, offsets)
        kw["cu_seqlens_q"] = offsets
        return "error"

    return apply


def _not_from_zero(draw: st.DrawFn, offsets: torch.Tensor) -> None:
    offsets += draw(st.sampled_from([1, -1, 2**30]))


def _decreasing(draw: st.DrawFn, offsets: torch.Tensor) -> None:
    i = draw(st.integers(1, offsets.shape[0] - 1))
    offsets[i] = offsets[i - 1] - draw(st.integers(1, 3))


def _last_not_tokens(draw: st.DrawFn, offsets: torch.Tensor) -> None:
    offsets[-1] += draw(st.sampled_from([1, 2, -(2**31) + 1]))


def _one_more_offset(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    offsets = kw["cu_seqlens_q"]
    kw["cu_seqlens_q"] = torch.cat([offsets, offsets[-1:]]) if draw(st.booleans()) else offsets[:-1]
    return "error"


def _max_q_len_too_small(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    offsets = kw["cu_seqlens_q"].tolist()
    longest = max(b - a for a, b in zip(offsets, offsets[1:]))
    kw["max_q_len"] = draw(st.integers(1, longest - 1)) if longest > 1 else draw(st.sampled_from([0, -1]))
    return "error"


def _max_q_len_larger(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    kw["max_q_len"] += draw(st.integers(1, 100))
    return "same"


def _segment_longer_than_its_sequence(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    offsets, lengths = kw["cu_seqlens_q"].tolist(), kw["cache_seqlens"].clone()
    with_tokens = [b for b, (a, c) in enumerate(zip(offsets, offsets[1:])) if c > a]
    if not with_tokens:
        kw["cache_seqlens"] = lengths - 1 - int(lengths.max())
        return "error"
    b = draw(st.sampled_from(with_tokens))
    lengths[b] = offsets[b + 1] - offsets[b] - 1
    kw["cache_seqlens"] = lengths
    return "error"


EXTEND_MUTATIONS = [
    *PAGED_MUTATIONS,
    *ORACLE_MUTATIONS,
    *_query_mutations(3),
    *tensor_mutations("cu_seqlens_q", (torch.int32,)),
    Mutation("cu_seqlens_q not from 0", ("cu_seqlens_q",), _offsets_edit(_not_from_zero)),
    Mutation("cu_seqlens_q decreasing", ("cu_seqlens_q",), _offsets_edit(_decreasing)),
    Mutation("cu_seqlens_q last != tokens", ("cu_seqlens_q",), _offsets_edit(_last_not_tokens)),
    Mutation("cu_seqlens_q batch", ("cu_seqlens_q",), _one_more_offset),
    Mutation("max_q_len too small", ("max_q_len",), _max_q_len_too_small),
    value_mutation("max_q_len", NOT_AN_INT),
    Mutation("max_q_len larger", (), _max_q_len_larger),
    Mutation("segment longer than its sequence", ("cache_seqlens",), _segment_longer_than_its_sequence),
]


@_fuzz_each(EXTEND_MUTATIONS, case=_extend_cases())
def test_fuzz_mla_extend(device, backend, case, mutation, data):
    batch, new = case
    offsets = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=device)
    kwargs = _paged_kwargs(batch, backend, device) | {"q": batch.q.to(device), "cu_seqlens_q": offsets, "max_q_len": max(new + [1])}
    _run_probe("mla_extend", mutation, data.draw, kwargs, mla_extend, _naive_extend)


# --- plan_prefill + mla_prefill ---

NOPE, V_DIM = 16, 16


def _prefill(q, kv_cache, kv_b_weight, kv_scale, softmax_scale, backend, new_tokens, cache_lens, block_table, page_size,
             prefix_chunk_tokens=8192, heads=None, meta=None, cache_seqlens=None, kv_lora_rank=None):
    """plan_prefill (unless `meta` is given) then mla_prefill, as a step does (the paged kwargs'
    cache_seqlens and kv_lora_rank are not used)."""
    if meta is None:
        meta = plan_prefill(new_tokens, cache_lens, block_table, page_size, prefix_chunk_tokens=prefix_chunk_tokens, heads=heads)
    return mla_prefill(q, kv_cache, kv_b_weight, meta, softmax_scale=softmax_scale, backend=backend, kv_scale=kv_scale)


def _counts_mismatch(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    argument = draw(st.sampled_from(["new_tokens", "cache_lens"]))
    kw[argument] = draw(st.sampled_from([list(kw[argument]) + [1], list(kw[argument])[:-1], 3, None]))
    return "error"


def _foreign_meta(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    meta = plan_prefill([n + 1 for n in kw["new_tokens"]], [n + 1 for n in kw["cache_lens"]], kw["block_table"], kw["page_size"])
    kw["meta"] = draw(st.sampled_from([{"meta": meta}, "meta", meta]))
    return "error"


def _weight_rows(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    heads = kw["q"].shape[1]
    rows = draw(st.sampled_from([0, heads * NOPE, heads * (NOPE + V_DIM) + 1]))  # d_v 0, or not heads x (d_nope + d_v)
    kw["kv_b_weight"] = kw["kv_b_weight"].new_zeros(rows + (heads == 1 and rows % 2), kw["kv_b_weight"].shape[1])
    return "error"


PREFILL_MUTATIONS = [
    *[m for m in PAGED_MUTATIONS if m.blamed[:1] not in (("cache_seqlens",), ("kv_lora_rank",))],
    *_query_mutations(3)[:4],
    *tensor_mutations("kv_b_weight", (torch.bfloat16, torch.float16, torch.float32)),
    count_entry_mutation("new_tokens", st.sampled_from([-1, 10**9]) | NOT_AN_INT),
    count_entry_mutation("cache_lens", st.sampled_from([-1, 10**9]) | NOT_AN_INT),
    Mutation("counts per sequence", ("new_tokens", "cache_lens"), _counts_mismatch),
    value_mutation("page_size", st.sampled_from([0, -4]) | NOT_AN_INT),
    value_mutation("prefix_chunk_tokens", st.sampled_from([0, -1]) | NOT_AN_INT),
    value_mutation("heads", st.sampled_from([0, -2]) | NOT_AN_INT.filter(lambda v: v is not None)),
    valid_value_mutation("prefix_chunk_tokens", st.integers(1, 64)),
    valid_value_mutation("heads", st.integers(1, 1000)),
    Mutation("foreign meta", ("meta", "q"), _foreign_meta),
    Mutation("kv_b_weight shape", ("kv_b_weight",), _weight_rows),
]


@_fuzz_each(PREFILL_MUTATIONS, case=_extend_cases())
def test_fuzz_plan_prefill_and_mla_prefill(device, backend, case, mutation, data):
    batch, new = case
    heads, rank = batch.q.shape[2], batch.kv_lora_rank
    gen = torch.Generator().manual_seed(len(new))
    kwargs = _paged_kwargs(batch, backend, device) | dict(
        q=torch.randn(sum(new), heads, NOPE + batch.q.shape[-1] - rank, generator=gen).to(batch.q.dtype).to(device),
        kv_b_weight=(torch.randn(heads * (NOPE + V_DIM), rank, generator=gen) / rank**0.5).to(batch.q.dtype).to(device),
        new_tokens=new, cache_lens=batch.cache_seqlens.tolist(), page_size=batch.kv_cache.shape[1],
    )
    _run_probe("plan_prefill + mla_prefill", mutation, data.draw, kwargs, _prefill)


def _regression_inputs() -> dict[str, Any]:
    q = torch.randn(2, 1, 2, 80).bfloat16()
    cache = torch.randn(6, 4, 80).bfloat16()
    table, lens = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([5, 3], dtype=torch.int32)
    return dict(q=q, cache=cache, table=table, lens=lens, q3=torch.randn(3, 2, 80).bfloat16(),
                cu=torch.tensor([0, 2, 3], dtype=torch.int32), meta=plan_prefill([2], [5], table[:1], 4),
                w=torch.randn(2 * 32, 64).bfloat16(), qp=torch.randn(2, 2, 32).bfloat16())


@pytest.mark.parametrize("call, message", [
    # before: TypeError unhashable type: 'list'
    (lambda i: mla_decode(i["q"], i["cache"], i["table"], i["lens"], kv_lora_rank=64, backend=["x"]), r"^backend: expected a registered"),
    # before: TypeError '<' not supported between instances of 'int' and 'str'
    (lambda i: mla_decode(i["q"], i["cache"], i["table"], i["lens"], kv_lora_rank="64"), r"^kv_lora_rank: expected an integer in 1\.\.79"),
    # before: AttributeError 'str' object has no attribute 'backend'
    (lambda i: mla_decode(i["q"], i["cache"], i["table"], i["lens"], kv_lora_rank=64, metadata="x"), r"^metadata: expected a DecodeMetadata"),
    # before: "block_table: expected shape [3, max_pages] (batch of q)"
    (lambda i: mla_extend(i["q3"], i["cache"], i["table"], i["lens"], torch.tensor([0, 1, 2, 3], dtype=torch.int32), max_q_len=2,
                          kv_lora_rank=64), r"^cu_seqlens_q: expected 3 offsets \(batch \+ 1, block_table has 2 rows\)"),
    # before: "cu_seqlens_q: expected the last offset to equal q's 3 tokens, got first offset 1"
    (lambda i: mla_extend(i["q3"], i["cache"], i["table"], i["lens"], i["cu"] + 1, max_q_len=2, kv_lora_rank=64),
     r"^cu_seqlens_q: expected offsets starting at 0, got first offset 1"),
    # before: accepted True as 1
    (lambda i: mla_extend(i["q3"], i["cache"], i["table"], i["lens"], i["cu"], max_q_len=True, kv_lora_rank=64), r"^max_q_len: expected an integer"),
    # before: AttributeError 'list' object has no attribute 'dim' / 'dict' object has no attribute 'queries'
    (lambda i: mla_prefill(i["qp"], i["cache"].tolist(), i["w"], i["meta"], softmax_scale=0.1), r"^kv_cache: expected a torch\.Tensor"),
    (lambda i: mla_prefill(i["qp"], i["cache"], i["w"], {}, softmax_scale=0.1), r"^meta: expected a PrefillMetadata"),
    # before: 2.5 silently became 2; NaN raised ValueError; a list table AttributeError; page_size 4.0 IndexError
    (lambda i: plan_prefill([2.5], [5], i["table"][:1], 4), r"^new_tokens\[0\]: expected an integer, got 2\.5"),
    (lambda i: plan_prefill([float("nan")], [5], i["table"][:1], 4), r"^new_tokens\[0\]: expected an integer"),
    (lambda i: plan_prefill([2], [5], [[0, 1]], 4), r"^block_table: expected an int32 tensor"),
    (lambda i: plan_prefill([2], [5], i["table"][:1], 4.0), r"^page_size: expected an integer >= 1, got 4\.0"),
    # before: TypeError from repeat_interleave; NaN was accepted
    (lambda i: plan_prefill([2], [5], i["table"][:1], 4, prefix_chunk_tokens=1.5), r"^prefix_chunk_tokens: expected an integer >= 1"),
    (lambda i: plan_prefill([2], [5], i["table"][:1], 4, prefix_chunk_tokens=float("nan")), r"^prefix_chunk_tokens: expected"),
])
def test_regressions_found_by_the_attention_fuzz(call, message):
    with pytest.raises(MLAInputError, match=message):
        call(_regression_inputs())
