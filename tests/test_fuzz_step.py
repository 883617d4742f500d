"""Fuzz of AttentionStep + mla_forward (one layer over a mixed step) and DecodeGraphs' constructor:
a malformed step or call is refused naming the argument, valid policy changes (prefill form, latent
extend threshold, prefix chunk size) give the same output, and the cache never changes."""

from __future__ import annotations

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
    count_entry_mutation,
    tensor_mutations,
    valid_value_mutation,
    value_mutation,
)
from paged_inputs import relative_error
from mlakit import MLAKitError, PagedLatentCache
from mlakit.serving.forward import mla_forward
from mlakit.serving.graphs import DecodeGraphs
from mlakit.serving.step import AttentionStep

HEADS, NOPE, ROPE, RANK, V_DIM, PAGE_SIZE = 2, 8, 8, 16, 8, 4
STEP_ARGS = ("new_tokens", "cache_lens", "block_table", "slots", "page_size", "decode_q_len", "prefill_form",
             "max_latent_extend_tokens", "prefix_chunk_tokens", "heads", "spec_mode")


def _forward(**kw: Any) -> torch.Tensor:
    step = AttentionStep(**{k: kw[k] for k in STEP_ARGS if k in kw})
    return mla_forward(kw["q_nope"], kw["q_pe"], kw["kv_cache"], kw["kv_scale"], kw["kv_b_weight"], step,
                       softmax_scale=kw["softmax_scale"], decode_backend=kw["decode_backend"], prefill_backend=kw["prefill_backend"])


@st.composite
def _steps(draw: st.DrawFn) -> dict[str, Any]:
    """A mixed step over a small cache: each sequence has a prefix (maybe 0) and adds new tokens."""
    batch = draw(st.integers(1, 3))
    prefixes = draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))
    new = [draw(st.integers(0 if p else 1, 20)) for p in prefixes]
    cache = PagedLatentCache(24, PAGE_SIZE, RANK, ROPE, dtype=draw(st.sampled_from(["bf16", "fp32"])))
    gen = torch.Generator().manual_seed(sum(prefixes) + 7 * sum(new))
    slots = [cache.append(b, torch.randn(p + n, RANK, generator=gen), torch.randn(p + n, ROPE, generator=gen))[p:]
             for b, (p, n) in enumerate(zip(prefixes, new))]
    tokens = sum(new)
    return dict(new_tokens=tuple(new), cache_lens=tuple(p + n for p, n in zip(prefixes, new)), block_table=cache.block_table(list(range(batch))),
                slots=torch.cat(slots), page_size=PAGE_SIZE, heads=HEADS, kv_cache=cache.data, kv_scale=cache.scale,
                q_nope=torch.randn(tokens, HEADS, NOPE, generator=gen), q_pe=torch.randn(tokens, HEADS, ROPE, generator=gen),
                kv_b_weight=torch.randn(HEADS * (NOPE + V_DIM), RANK, generator=gen) / RANK**0.5, softmax_scale=0.25,
                decode_backend="reference", prefill_backend="reference")


def _foreign_step(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    kw["new_tokens"] = draw(st.sampled_from([None, "1", 3]))
    return "error"


def _weight_rows(draw: st.DrawFn, kw: dict[str, Any]) -> Expect:
    rows = draw(st.sampled_from([HEADS * NOPE, HEADS * (NOPE + V_DIM) + 1, 1]))
    kw["kv_b_weight"] = torch.randn(rows, RANK)
    return "error"


STEP_MUTATIONS = [
    count_entry_mutation("new_tokens", st.sampled_from([-1, 10**6]) | NOT_AN_INT),
    count_entry_mutation("cache_lens", st.sampled_from([-1, 10**6]) | NOT_AN_INT),
    Mutation("new_tokens not a sequence", ("new_tokens",), _foreign_step),
    *tensor_mutations("slots", (torch.int64,)),
    *tensor_mutations("block_table", (torch.int32,)),
    value_mutation("page_size", st.sampled_from([0, -1]) | NOT_AN_INT),
    value_mutation("decode_q_len", st.sampled_from([0, -1]) | NOT_AN_INT.filter(lambda v: v is not None)),
    value_mutation("prefill_form", st.sampled_from(["", "dense", None, 1])),
    value_mutation("spec_mode", st.sampled_from(["eagle", None, 0])),
    value_mutation("max_latent_extend_tokens", st.sampled_from([-1]) | NOT_AN_INT),
    value_mutation("prefix_chunk_tokens", st.sampled_from([0, -1]) | NOT_AN_INT),
    value_mutation("heads", st.sampled_from([0, -1]) | NOT_AN_INT.filter(lambda v: v is not None)),
    *tensor_mutations("q_nope", (torch.float32, torch.bfloat16, torch.float16, torch.float64), blamed=("q_pe",)),
    *tensor_mutations("q_pe", (torch.float32, torch.bfloat16, torch.float16, torch.float64), blamed=("q_nope",)),
    *tensor_mutations("kv_b_weight", (torch.float32, torch.bfloat16, torch.float16, torch.float64)),
    Mutation("kv_b_weight rows", ("kv_b_weight",), _weight_rows),
    value_mutation("softmax_scale", NOT_A_POSITIVE_NUMBER),
    value_mutation("decode_backend", NOT_A_BACKEND, blamed=("backend",)),
    value_mutation("prefill_backend", NOT_A_BACKEND, blamed=("backend",)),
    valid_value_mutation("prefill_form", st.sampled_from(["auto", "latent", "mha"])),
    valid_value_mutation("max_latent_extend_tokens", st.integers(0, 25)),
    valid_value_mutation("prefix_chunk_tokens", st.integers(1, 40)),
]


@settings(FUZZ, max_examples=4)
@pytest.mark.parametrize("mutation", STEP_MUTATIONS, ids=lambda m: m.label)
@given(kwargs=_steps(), data=st.data())
def test_fuzz_attention_step_and_mla_forward(mutation, kwargs, data):
    mutated = dict(kwargs)
    expect = mutation.apply(data.draw, mutated)
    before = snapshot(kwargs["kv_cache"], kwargs["block_table"], kwargs["slots"])
    if expect == "error":
        probe("AttentionStep + mla_forward", mutation.blamed, lambda: _forward(**mutated))
    else:
        expected = _forward(**kwargs)
        probe("AttentionStep + mla_forward", None, lambda: _forward(**mutated),
              lambda out: relative_error(out, expected) < 2e-2 or pytest.fail(f"relative error {relative_error(out, expected)}"))
    assert_unchanged(before, kwargs["kv_cache"], kwargs["block_table"], kwargs["slots"])


# "cuda" is a device DecodeGraphs refuses only where there is none.
NOT_CUDA_DEVICES = ["cpu", torch.device("cpu"), "nope", None] + ([] if torch.cuda.is_available() else ["cuda"])
GRAPH_ARGS = dict(backend="reference", max_batch=4, q_len=1, heads=2, dim=24, max_pages=2, dtype=torch.bfloat16,
                  device=torch.device("cpu"), page_size=16, num_pages=8)


@settings(FUZZ, max_examples=20)
@given(argument=st.sampled_from(["backend", "device", "max_batch", "q_len"]), data=st.data())
def test_fuzz_decode_graphs_constructor_refuses_cleanly_off_cuda(argument, data):
    value = data.draw({"backend": NOT_A_BACKEND | st.just("intel_xpu"), "device": st.sampled_from(NOT_CUDA_DEVICES),
                       "max_batch": st.sampled_from([0, -1]) | NOT_AN_INT, "q_len": st.sampled_from([0]) | NOT_AN_INT}[argument])
    probe("DecodeGraphs()", (argument, "device", "CUDA"), lambda: DecodeGraphs(lambda b: b.q, **(GRAPH_ARGS | {argument: value})))


def _regression_step(**changes: Any) -> AttentionStep:
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    return AttentionStep(**(dict(new_tokens=(1, 2), cache_lens=(5, 2), block_table=table, slots=torch.tensor([4, 8, 9]), page_size=8) | changes))


@pytest.mark.parametrize("call, message", [
    # before: a float slots tensor was accepted (and a list failed with AttributeError)
    (lambda: _regression_step(slots=torch.tensor([4.0, 8.0, 9.0])), r"^slots: expected shape \[3\] and dtype int64"),
    # before: accepted, then failed (or not) only when a prefill part was planned
    (lambda: _regression_step(prefix_chunk_tokens=0), r"^prefix_chunk_tokens: expected an integer >= 1"),
    (lambda: _regression_step(max_latent_extend_tokens=-1), r"^max_latent_extend_tokens: expected an integer >= 0"),
    (lambda: _regression_step(decode_q_len=1.5), r"^decode_q_len: expected None or an integer >= 1"),
    # before: RuntimeError from view(); AttributeError for a list; int queries gave a result
    (lambda: mla_forward(torch.randn(3, 2, 16), torch.randn(3, 2, 16), torch.randn(2, 8, 48), None, torch.randn(33, 32),
                         _regression_step(), softmax_scale=0.2), r"^kv_b_weight: expected \[2 heads"),
    (lambda: mla_forward([[0.0]], torch.randn(3, 2, 16), torch.randn(2, 8, 48), None, torch.randn(48, 32), _regression_step(),
                         softmax_scale=0.2), r"^q_nope: expected a floating-point tensor, got list"),
    (lambda: mla_forward(torch.ones(3, 2, 16, dtype=torch.int64), torch.randn(3, 2, 16), torch.randn(2, 8, 48), None,
                         torch.randn(48, 32), _regression_step(), softmax_scale=0.2), r"^q_nope: expected a floating-point tensor"),
    # before: AttributeError 'str' object has no attribute 'type'; AssertionError "Torch not compiled with CUDA" off CUDA
    (lambda: DecodeGraphs(lambda b: b.q, **(GRAPH_ARGS | {"device": "cpu"})), r"^device: CUDA graphs need a CUDA device"),
    (lambda: DecodeGraphs(lambda b: b.q, **(GRAPH_ARGS | {"backend": ["triton"]})), r"unknown backend \['triton'\]"),
])
def test_regressions_found_by_the_step_fuzz(call, message):
    with pytest.raises(MLAKitError, match=message):
        call()
