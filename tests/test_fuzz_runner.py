"""Fuzz of Runner / Request with malformed requests: each bad field fails with a ConfigError naming the
request and the field before any step runs (no page taken), a request the cache can never hold is
refused up front instead of waiting forever, and valid odd requests (late arrivals, tiny caches,
batch size 1) finish with the tokens each request gets alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_outcomes import FUZZ, probe, within
from fuzz_strategies import NOT_AN_INT, TINY_DEEPSEEK, save_tiny_deepseek
from mlakit import ConfigError, PagedLatentCache
from mlakit.model.loader import load_model
from mlakit.model.runner import Request, Runner

PAGE_SIZE, NUM_PAGES = 4, 8
VOCAB = TINY_DEEPSEEK["vocab_size"]
BAD_FIELDS = {
    "prompt_ids": st.sampled_from([[], "123", [1, -2], [1, 2.5], [True], None]),
    "max_new_tokens": st.sampled_from([0, -1]) | NOT_AN_INT,
    "temperature": st.sampled_from([-0.5, float("nan"), float("inf"), "0.7", None, True]),
    "top_p": st.sampled_from([0.0, -0.1, 1.5, float("nan"), "0.9", None, True]),
    "seed": st.sampled_from([-1]) | NOT_AN_INT,
    "arrival_step": st.sampled_from([-1]) | NOT_AN_INT,
}
REQUESTS = st.lists(st.builds(Request, st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), st.integers(1, 3),
                              arrival_step=st.integers(0, 3)), min_size=1, max_size=3)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    return load_model(save_tiny_deepseek(tmp_path_factory.mktemp("tiny")))


def _runner(model, num_pages: int = NUM_PAGES, **kwargs) -> Runner:
    cache = PagedLatentCache(num_pages, PAGE_SIZE, 16, 8, dtype="fp32", num_layers=model.config.num_layers)
    return Runner(model, cache, **({"decode_backend": "reference"} | kwargs))


def _copy(request: Request, **changes) -> Request:
    fields = dict(prompt_ids=list(request.prompt_ids), max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                  top_p=request.top_p, seed=request.seed, arrival_step=request.arrival_step)
    return Request(**(fields | changes))


@settings(FUZZ, max_examples=40)
@given(requests=REQUESTS, field=st.sampled_from(sorted(BAD_FIELDS)), data=st.data(), at_construction=st.booleans())
def test_fuzz_bad_request_fields_are_refused_naming_them(model, requests, field, data, at_construction):
    value = data.draw(BAD_FIELDS[field])
    index = data.draw(st.integers(0, len(requests) - 1))
    runner = _runner(model)
    if at_construction:
        probe("Request", (field,), lambda: _copy(requests[index], **{field: value}))
        return
    setattr(requests[index], field, value)
    with within(30):
        error = probe("Runner.generate", (field,), lambda: runner.generate(requests))
    assert f"requests[{index}].{field}" in str(error)
    assert runner.cache.allocator.num_free == NUM_PAGES and runner.stats.prefill_steps == 0, "refused before any step"


@settings(FUZZ, max_examples=15)
@given(requests=REQUESTS, index=st.integers(0, 2), extra=st.integers(1, 10**6))
def test_fuzz_a_request_the_cache_can_never_hold_is_refused_at_once(model, requests, index, extra):
    index %= len(requests)
    request = requests[index]
    request.max_new_tokens = NUM_PAGES * PAGE_SIZE - len(request.prompt_ids) + extra
    runner = _runner(model)
    with within(30):
        error = probe("Runner.generate", ("requests",), lambda: runner.generate(requests))
    assert f"requests[{index}]" in str(error) and str(NUM_PAGES * PAGE_SIZE) in str(error)
    assert runner.cache.allocator.num_free == NUM_PAGES and runner.stats.prefill_steps == 0


@settings(FUZZ, max_examples=12)
@given(requests=REQUESTS, late=st.sampled_from([0, 7, 10**9]), num_pages=st.integers(3, 8), max_batch_size=st.integers(1, 3))
def test_fuzz_odd_but_valid_schedules_finish_with_each_requests_solo_tokens(model, requests, late, num_pages, max_batch_size):
    fits = [r for r in requests if len(r.prompt_ids) + r.max_new_tokens <= num_pages * PAGE_SIZE]
    solo = [_runner(model).generate([_copy(r, arrival_step=0)])[0] for r in fits]
    scheduled = [_copy(r, arrival_step=r.arrival_step + late * i) for i, r in enumerate(fits)]
    runner = _runner(model, num_pages, max_batch_size=max_batch_size)
    with within(60):
        probe("Runner.generate", None, lambda: runner.generate(scheduled), lambda outputs: _assert_equal(outputs, solo))
    assert runner.cache.allocator.num_free == num_pages


def _assert_equal(outputs: list[list[int]], expected: list[list[int]]) -> None:
    assert outputs == expected


@pytest.mark.parametrize("argument, value", [("max_batch_size", 0), ("max_batch_size", 1.5), ("decode_backend", "nope"),
                                             ("decode_backend", ["reference"]), ("prefill_backend", None)])
def test_fuzz_bad_runner_arguments_are_refused_naming_them(model, argument, value):
    probe("Runner", (argument, "backend"), lambda: _runner(model, **{argument: value}))


def test_runner_refuses_request_ids_the_cache_already_holds(model):
    runner = _runner(model)
    runner.cache.reserve(0, 3)
    with within(30):
        probe("Runner.generate", ("requests",), lambda: runner.generate([Request([1, 2], 2)]))
    assert runner.cache.seq_len(0) == 3


def test_late_arrival_does_not_spin_through_empty_steps(model):
    """Regression: a request arriving at step 10**9 made generate count a billion empty steps."""
    with within(30):
        assert len(_runner(model).generate([Request([1, 2, 3], 2, arrival_step=10**9)])[0]) == 2


def test_nan_temperature_and_token_ids_outside_the_vocabulary_are_refused(model):
    """Regressions: NaN temperature passed Request's check and failed in torch.multinomial; a token
    id >= vocab_size failed deep in the embedding with an IndexError."""
    with pytest.raises(ConfigError, match=r"^Request\.temperature: expected a finite number >= 0"):
        Request([1], 2, temperature=float("nan"))
    with pytest.raises(ConfigError, match=rf"^requests\[0\]\.prompt_ids: expected token ids < the vocabulary size {VOCAB}"):
        _runner(model).generate([Request([1, VOCAB], 2)])


def test_huge_seed_samples_without_overflow(model):
    """Regression: seed * 1_000_003 overflowed torch's 64-bit seed ("Overflow when unpacking long")."""
    assert len(_runner(model).generate([Request([1, 2], 2, temperature=1.0, seed=2**63)])[0]) == 2

