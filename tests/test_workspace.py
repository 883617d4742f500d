"""Workspace pools: one buffer per (device, family), zero-fill rules, no growth during capture."""

import dataclasses

import pytest
import torch

from mlakit import DeviceInfo, MLAShape, ServingConfig, WorkspaceError, WorkspacePool, resolve
from mlakit.registry import all_records, get_backend
from mlakit.registry.catalog import _REGISTRY, RegisteredBackend


def _reference_prefill(q, kv_cache, kv_b_weight, meta, *, softmax_scale, kv_scale):
    """A prefill kernel (PrefillKernel signature) for the test-only backend below: the reference backend's."""
    return get_backend("reference").prefill(q, kv_cache, kv_b_weight, meta, softmax_scale=softmax_scale, kv_scale=kv_scale)


@pytest.fixture
def trtllm_prefill(monkeypatch):
    """trtllm_mla's record, prefill only, with a prefill kernel, registered for one test as
    "zz_trtllm_prefill" (mlakit has no adapter for trtllm_mla's own prefill, so resolve() never picks it)."""
    all_records()  # loads the built-in backends before the registry is patched
    record = dataclasses.replace(
        get_backend("trtllm_mla").record, name="zz_trtllm_prefill", phases=frozenset({"prefill"}), auto_rank=10_000
    )
    assert record.name not in _REGISTRY
    monkeypatch.setitem(_REGISTRY, record.name, RegisteredBackend(record, None, None, _reference_prefill))
    return record.name


def test_same_family_shares_and_grows_other_families_do_not_share():
    pool = WorkspacePool()
    small = pool.get("flashinfer_float", "cpu", 64)
    again = pool.get("flashinfer_float", "cpu", 32)
    assert again.data_ptr() == small.data_ptr()
    other = pool.get("tokenspeed", "cpu", 64)
    assert other.data_ptr() != small.data_ptr()
    grown = pool.get("flashinfer_float", "cpu", 128)
    assert grown.numel() == 128 and pool.nbytes("flashinfer_float", "cpu") == 128


def test_zero_filled_families_start_zeroed_and_keep_one_rule():
    pool = WorkspacePool()
    buffer = pool.get("trtllm_gen", "cpu", 4096, zero_filled=True)
    assert (buffer == 0).all()
    with pytest.raises(WorkspaceError, match="reserved with zero_filled=True"):
        pool.get("trtllm_gen", "cpu", 16, zero_filled=False)


def test_plan_reserves_its_workspaces_in_separate_families(trtllm_prefill):
    plan = resolve(
        ServingConfig(decode_backend="cutedsl_mla", prefill_backend=trtllm_prefill, max_batch_size=8),
        MLAShape.preset("deepseek-v3"),
        DeviceInfo.from_arch("sm100"),
    )
    families = {w.family: w for w in plan.workspaces}
    assert families["trtllm_gen"].backends == (trtllm_prefill,) and families["cutedsl"].backends == ("cutedsl_mla",)
    assert set(families) == {"trtllm_gen", "cutedsl"}
    assert families["trtllm_gen"].zero_filled and not families["cutedsl"].zero_filled
    pool = WorkspacePool()
    pool.reserve([(w.family, 1024, w.zero_filled) for w in plan.workspaces], "cpu")
    assert pool.nbytes("trtllm_gen", "cpu") == pool.nbytes("cutedsl", "cpu") == 1024


@pytest.mark.gpu
def test_growth_during_cuda_graph_capture_is_refused():
    pool = WorkspacePool()
    pool.get("flashinfer_float", "cuda", 1 << 20)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with pytest.raises(WorkspaceError, match="during CUDA-graph capture; reserve it before capture"):
            with torch.cuda.graph(graph):
                pool.get("flashinfer_float", "cuda", 1 << 19)
                pool.get("flashinfer_float", "cuda", 1 << 21)
