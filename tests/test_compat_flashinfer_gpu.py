"""mlakit.compat.flashinfer on a GPU: our Triton kernels behind FlashInfer's wrapper against the
reference, captured in a CUDA graph and replayed after a re-plan, and side by side with the real
FlashInfer where `import flashinfer` works (skipped cleanly elsewhere)."""

import warnings

import pytest
import torch

from flashinfer_inputs import assert_matches, fp8_cache, make_step, reference, relative_error
from mlakit.compat.flashinfer import BatchMLAPagedAttentionWrapper
from mlakit.serving.graphs import capture_graph

pytestmark = pytest.mark.gpu

GRID = [
    # kv_lens, q_lens, heads, page_size, causal
    ([37, 0, 5, 1300], [1, 1, 1, 1], 16, 16, True),
    ([64, 1, 2000], [1, 1, 1], 128, 64, True),
    ([90, 3, 17], [2, 2, 2], 5, 1, True),
    ([500, 20], [8, 8], 20, 16, True),
    ([400, 7, 33, 120], [1, 4, 2, 3], 128, 64, True),
    ([70, 0, 900], [3, 1, 2], 7, 32, True),
    ([300, 5, 180], [3, 1, 2], 16, 16, False),
]


def _workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


def _plan(wrapper, step, causal=True, kv_data_type=None):
    wrapper.plan(*step.csr(), *step.plan_args(causal, kv_data_type))
    return wrapper


@pytest.mark.parametrize(("kv_lens", "q_lens", "heads", "page_size", "causal"), GRID)
def test_triton_behind_the_wrapper_matches_reference(kv_lens, q_lens, heads, page_size, causal):
    step = make_step(kv_lens, q_lens, heads=heads, page_size=page_size, seed=heads + page_size, device="cuda")
    wrapper = _plan(BatchMLAPagedAttentionWrapper(_workspace()), step, causal)
    assert wrapper.backend == "triton"
    out, lse = wrapper.run(*step.split_query(), *step.split_cache(), return_lse=True)
    assert_matches(out, lse, reference(step, causal=causal))


@pytest.mark.parametrize(("ckv_scale", "kpe_scale"), [(0.5, 0.5), (0.25, 0.0625)])
def test_fp8_cache(ckv_scale, kpe_scale):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("Triton runs fp8 from SM89")
    step = make_step([370, 0, 80], [1, 2, 2], heads=16, page_size=64, seed=7, device="cuda")
    stored, dequantized = fp8_cache(step, ckv_scale, kpe_scale)
    wrapper = _plan(BatchMLAPagedAttentionWrapper(_workspace()), step, kv_data_type=torch.float8_e4m3fn)
    out, lse = wrapper.run(query=step.q, kv_cache=stored, return_lse=True, ckv_scale=ckv_scale, kpe_scale=kpe_scale)
    assert_matches(out, lse, reference(step, cache=dequantized), out_tol=3e-2, lse_tol=3e-2)


@pytest.mark.parametrize("q_lens", [[1, 1, 1], [2, 2, 2], [2, 1, 3]])
def test_cuda_graph_replays_the_newest_plan(q_lens):
    batch, capacity = len(q_lens), 256
    buffers = dict(qo_indptr=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                   kv_indptr=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                   kv_indices=torch.zeros(capacity, dtype=torch.int32, device="cuda"),
                   kv_len_arr=torch.zeros(batch, dtype=torch.int32, device="cuda"))
    wrapper = BatchMLAPagedAttentionWrapper(_workspace(), True, **buffers, max_pages_per_request=64)
    steps = [make_step(lens, q_lens, heads=16, page_size=16, seed=seed, device="cuda")
             for seed, lens in enumerate([[300, 0, 45], [17, 900, 260], [5, 3, 1000]])]
    cache = torch.full((capacity, 16, 576), float("nan"), dtype=torch.bfloat16, device="cuda")
    q = torch.zeros_like(steps[0].q)

    def load(step):
        cache[: step.cache.shape[0]] = step.cache
        q.copy_(step.q)
        _plan(wrapper, step)

    load(steps[0])
    graph, (out, lse) = capture_graph(lambda: wrapper.run(query=q, kv_cache=cache, return_lse=True), warmup=1)
    for step in steps:
        load(step)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, lse, reference(step, cache=cache))


def _flashinfer_wrapper():
    flashinfer_mla = pytest.importorskip("flashinfer.mla", reason="flashinfer is not installed here")
    backend = "fa3" if torch.cuda.get_device_capability()[0] == 9 else "fa2"
    return flashinfer_mla.BatchMLAPagedAttentionWrapper(_workspace(), backend=backend)


@pytest.mark.parametrize(
    ("kv_lens", "q_lens", "heads", "page_size"),
    [
        ([37, 0, 5, 1300], [1, 1, 1, 1], 16, 16),
        ([64, 1, 2000], [1, 1, 1], 128, 64),
        ([90, 30, 17], [2, 2, 2], 128, 1),
        ([400, 70, 33, 120], [1, 4, 2, 3], 16, 64),
    ],
)
def test_same_results_as_flashinfer(kv_lens, q_lens, heads, page_size):
    real = _flashinfer_wrapper()
    step = make_step(kv_lens, q_lens, heads=heads, page_size=page_size, seed=heads, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _plan(real, step)
        want_out, want_lse = real.run(*step.split_query(), *step.split_cache(), return_lse=True)
    ours = _plan(BatchMLAPagedAttentionWrapper(_workspace()), step)
    out, lse = ours.run(*step.split_query(), *step.split_cache(), return_lse=True)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert relative_error(out, want_out) < 1e-2
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))  # zero-length requests: -inf in both
    assert (lse[seen] - want_lse[seen]).abs().max().item() < 1e-2  # both in base 2


def test_same_fp8_results_as_flashinfer():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FlashInfer runs fp8 MLA caches on SM90 only")
    real = _flashinfer_wrapper()
    step = make_step([370, 20, 80], [1, 1, 1], heads=16, page_size=64, seed=3, device="cuda")
    stored, _ = fp8_cache(step, 0.25, 0.0625)
    scales = dict(ckv_scale=0.25, kpe_scale=0.0625)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _plan(real, step, kv_data_type=torch.float8_e4m3fn)
        want_out, want_lse = real.run(*step.split_query(), stored[..., :512], stored[..., 512:], return_lse=True, **scales)
    ours = _plan(BatchMLAPagedAttentionWrapper(_workspace()), step, kv_data_type=torch.float8_e4m3fn)
    out, lse = ours.run(*step.split_query(), stored[..., :512], stored[..., 512:], return_lse=True, **scales)
    assert relative_error(out, want_out) < 3e-2
    assert (lse - want_lse).abs().max().item() < 3e-2


@pytest.mark.parametrize("heads, q_len", [(h, q) for h in (16, 64, 128) for q in (1, 2)])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_flashinfer_mla_backend_through_mla_decode(heads, q_len, page_size):
    """The registry's flashinfer_mla adapter (the real FlashInfer) on the backend grid, with zero and ragged lengths."""
    pytest.importorskip("flashinfer.mla", reason="flashinfer is not installed here")
    import mlakit
    from paged_inputs import assert_lse_close, make_paged_batch

    batch = make_paged_batch([1000, 0, 5, 257, 64], heads=heads, q_len=q_len, page_size=page_size, kv_lora_rank=512, rope_dim=64,
                             device="cuda", seed=heads + q_len + page_size)
    args = (batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens)
    expected_out, expected_lse = mlakit.reference_decode(*args, kv_lora_rank=512, softmax_scale=batch.softmax_scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out, lse = mlakit.mla_decode(*args, softmax_scale=batch.softmax_scale, backend="flashinfer_mla")
    assert relative_error(out, expected_out) < 1e-2
    assert_lse_close(lse, expected_lse, atol=1e-3)
