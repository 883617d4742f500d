"""How `mlakit.bench.timing` times calls: the sustained timer's settling and window (the CPU part with the GPU
calls stubbed, the rest on a GPU), and the clean-L2 timer."""

from __future__ import annotations

import time

import pytest
import torch

from mlakit.bench import timing


def test_settle_runs_for_the_given_time_in_doubling_batches(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(calls[0]))
    calls = [0]

    def call():
        calls[0] += 1
        time.sleep(0.002)

    began = time.perf_counter()
    per_call = timing._settle(call, 0.05)
    assert time.perf_counter() - began >= 0.05
    assert 0.002 <= per_call < 0.02
    batches = [b - a for a, b in zip([0, *syncs], syncs)]
    assert batches[:3] == [1, 2, 4]
    assert max(batches) * 0.002 <= timing.SETTLE_BATCH_SECONDS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sustained_time_of_a_matmul_is_close_to_the_flushed_median():
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    sustained = timing.sustained_ms(lambda: x @ x, 0.2, 0.2)
    flushed = timing.median_ms(lambda: x @ x)
    # Wide: other test workers may share the GPU (pytest -n) during one of the two windows; a unit slip is 1000x.
    assert 0.2 < sustained / flushed < 5.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sustained_counts_every_call_of_the_window():
    launches = []
    x = torch.randn(256, 256, device="cuda")

    def call():
        launches.append(1)
        return x @ x

    timing.sustained_ms(call, 0.0, 0.0)
    assert len(launches) == 1 + 3  # settling for 0 s runs one batch of one call; the window at least three


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_clean_l2_time_of_a_matmul_is_close_to_the_flushed_median_over_at_least_fifteen_calls():
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    assert 0.2 < timing.clean_l2_ms(lambda: x @ x) / timing.median_ms(lambda: x @ x) < 5.0  # wide: as above
    calls = []
    timing.clean_l2_ms(lambda: calls.append(x.add_(0)), rep_ms=1)
    assert len(calls) >= 5 + 10  # five to estimate, at least ten timed
