"""Fuzz of PagedLatentCache: after a random valid history of appends and frees, one malformed call is
refused naming its argument and leaves the rows, scales, allocator and page tables unchanged; bad
constructor arguments are refused naming them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_outcomes import FUZZ, assert_unchanged, probe, snapshot
from fuzz_strategies import NOT_AN_INT
from mlakit import MLAInputError, PagedLatentCache

RANK, ROPE, PAGE_SIZE, NUM_PAGES = 8, 4, 4, 6


def _history(cache: PagedLatentCache, steps: list[tuple[int, int]]) -> None:
    """Appends `n` random rows to sequence `seq` (or frees it when n == 0), skipping what does not fit."""
    gen = torch.Generator().manual_seed(len(steps))
    for seq, n in steps:
        if n == 0:
            cache.free(seq, missing_ok=True)
        elif -(-(cache.seq_len(seq) + n) // PAGE_SIZE) - len(cache.pages_of(seq)) <= cache.allocator.num_free:
            cache.append(seq, torch.randn(n, RANK, generator=gen), torch.randn(n, ROPE, generator=gen))


def _state(cache: PagedLatentCache) -> tuple[Any, ...]:
    return copy.deepcopy((cache.allocator._free, cache._pages, cache._lengths))


BAD_CALLS = {
    "c_kv": [lambda c: c.append(0, torch.randn(2, RANK + 1), torch.randn(2, ROPE)),
             lambda c: c.append(0, torch.randn(2, RANK).tolist(), torch.randn(2, ROPE)),
             lambda c: c.append(0, torch.ones(2, RANK, dtype=torch.int64), torch.randn(2, ROPE)),
             lambda c: c.append(0, torch.randn(RANK), torch.randn(1, ROPE))],
    "k_pe": [lambda c: c.append(0, torch.randn(2, RANK), torch.randn(3, ROPE)),
             lambda c: c.append(0, torch.randn(2, RANK), torch.randn(2, ROPE + 1)),
             lambda c: c.append(0, torch.randn(2, RANK), None)],
    "n": [lambda c: c.reserve(0, -1), lambda c: c.reserve(0, 2.5), lambda c: c.reserve(0, True), lambda c: c.reserve(0, "3")],
    "seq_id": [lambda c: c.free(999), lambda c: c.reserve("a", 1), lambda c: c.reserve(None, 1), lambda c: c.free([1]),
               lambda c: c.reserve(1.0, 1)],
    "out of KV pages": [lambda c: c.reserve(0, NUM_PAGES * PAGE_SIZE + 1),
                        lambda c: c.append(1, torch.randn(NUM_PAGES * PAGE_SIZE + 1, RANK), torch.randn(NUM_PAGES * PAGE_SIZE + 1, ROPE))],
    "max_pages": [lambda c: c.block_table([0, 1], max_pages=0), lambda c: c.block_table([0], max_pages=2.5)],
    "seq_ids": [lambda c: c.block_table(3), lambda c: c.seq_lens("01"), lambda c: c.block_table([0, None])],
}
CALLS = [(argument, i) for argument, calls in BAD_CALLS.items() for i in range(len(calls))]


@settings(FUZZ, max_examples=60)
@given(steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=8), call=st.sampled_from(CALLS),
       dtype=st.sampled_from(["bf16", "fp32", "fp8_e4m3"]))
def test_fuzz_a_refused_cache_call_changes_nothing(steps, call, dtype):
    cache = PagedLatentCache(NUM_PAGES, PAGE_SIZE, RANK, ROPE, dtype=dtype, scale_layout="group" if dtype == "fp8_e4m3" else "tensor")
    _history(cache, steps)
    argument, index = call
    state, before = _state(cache), snapshot(cache.data, cache.scale)
    probe("PagedLatentCache", (argument, "seq_ids"), lambda: BAD_CALLS[argument][index](cache))
    assert _state(cache) == state, "a refused call changed the page tables"
    assert_unchanged(before, cache.data, cache.scale)


CONSTRUCTOR = dict(num_pages=4, page_size=4, kv_lora_rank=8, rope_dim=4, dtype="bf16", scale_layout="tensor", num_layers=1)
BAD_CONSTRUCTOR_VALUES = {
    "num_pages": st.sampled_from([0, -1]) | NOT_AN_INT,
    "page_size": st.sampled_from([0, -4]) | NOT_AN_INT,
    "kv_lora_rank": st.sampled_from([0, -1]) | NOT_AN_INT,
    "rope_dim": st.sampled_from([-1]) | NOT_AN_INT,
    "num_layers": st.sampled_from([0]) | NOT_AN_INT,
    "dtype": st.sampled_from(["bf17", "", None, torch.bfloat16, "float8"]),
    "scale_layout": st.sampled_from(["channel", "", None]),
}


@settings(FUZZ, max_examples=40)
@given(argument=st.sampled_from(sorted(BAD_CONSTRUCTOR_VALUES)), data=st.data())
def test_fuzz_bad_cache_constructor_arguments_are_refused_naming_them(argument, data):
    value = data.draw(BAD_CONSTRUCTOR_VALUES[argument])
    kwargs = CONSTRUCTOR | {argument: value}
    probe("PagedLatentCache()", (argument,), lambda: PagedLatentCache(**kwargs))


def test_reserve_of_a_fractional_token_count_is_refused_before_the_lengths_change():
    """Regression: reserve(seq, 2.5) stored a length of 2.5 and returned 3 slots."""
    cache = PagedLatentCache(2, 4, 8, 4)
    with pytest.raises(MLAInputError, match=r"^n: expected a token count \(an integer >= 0\), got 2\.5"):
        cache.reserve(0, 2.5)
    assert cache.seq_len(0) == 0 and cache.allocator.num_free == 2
