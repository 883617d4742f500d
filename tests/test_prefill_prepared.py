"""The prefill prepared per input layout (`mlakit.prefill.prepared`): `mla_prefill` with
`check_inputs=False` keeps one in the step's metadata per layout, and later calls of that layout run
it. It must equal the unprepared call exactly (same kernels), read every tensor where it now is, and
decline what it does not serve (those calls take the unprepared path)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import mlakit
from mlakit.prefill.metadata import KeyRows, PrefillMetadata, Segments
from mlakit.kernels import gather_decompress
from mlakit.prefill import prepared
from mlakit.prefill.prepared import TorchGather, fused_rows, prepare_prefill
from test_prefill import Problem, _assert_matches

CASES = [
    # prefixes, new tokens, heads, page_size, prefix_chunk_tokens
    ([0, 0], [5, 9], 3, 16, None),  # no prefix: one causal pass
    ([40, 25, 0], [12, 0, 3], 1, 16, None),  # prefixes joining the causal pass
    ([60, 0, 13], [6, 4, 0], 5, 4, 16),  # 4 prefix chunks merged into a 16-bit running result
    ([60, 0, 13], [6, 4, 0], 5, 4, 8),  # 8 chunks: merged into a float32 result, then converted
]


def _prefill(problem: Problem, meta: PrefillMetadata, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    return mlakit.mla_prefill(problem.q, problem.batch.kv_cache, problem.weight, meta, softmax_scale=problem.scale,
                              backend="triton", **kwargs)


@pytest.mark.parametrize("fused_limit", [prepared.FUSED_GATHER_LIMIT, 0], ids=["fused", "torch-gather"])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("prefixes, new, heads, page_size, chunk", CASES)
def test_prepared_call_equals_the_checked_call_exactly(prefixes, new, heads, page_size, chunk, q_dtype, fused_limit,
                                                       kernel_device, monkeypatch):
    monkeypatch.setattr(prepared, "FUSED_GATHER_LIMIT", fused_limit)
    problem = Problem(prefixes, new, heads=heads, page_size=page_size, q_dtype=q_dtype, seed=sum(prefixes) + heads,
                      device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=chunk)
    assert bool(meta.prefix_chunks) == (chunk is not None)
    assert meta.merges_per_row == {None: 0, 16: 4, 8: 8}[chunk]
    checked = _prefill(problem, meta)
    assert not meta.calls  # checked calls never prepare
    first = _prefill(problem, meta, check_inputs=False)  # resolves, prepares, runs the prepared call
    assert len(meta.calls) == 1
    again = _prefill(problem, meta, check_inputs=False)  # the prepared call
    for out, lse in (first, again):
        assert out.dtype == q_dtype and torch.equal(out, checked[0]) and torch.equal(lse, checked[1])
    _assert_matches(*again, *problem.latent_form())


def test_prepared_call_reads_tensors_where_they_now_are(kernel_device):
    problem = Problem([30, 9], [7, 5], heads=3, page_size=8, seed=1, device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=16)
    for _ in range(2):
        _prefill(problem, meta, check_inputs=False)
    for _ in range(2):  # same layout, new tensors (the allocator may reuse freed addresses) and values
        problem.q = torch.randn_like(problem.q)
        problem.batch.kv_cache = -problem.batch.kv_cache  # (unused slots stay NaN)
        problem.weight = problem.weight.roll(1, 0)
        gc.collect()
        _assert_matches(*_prefill(problem, meta, check_inputs=False), *problem.latent_form())
    problem.q.copy_(torch.randn_like(problem.q))  # new values at the same addresses
    problem.weight.copy_(problem.weight.roll(1, 1))
    problem.batch.kv_cache.neg_()
    _assert_matches(*_prefill(problem, meta, check_inputs=False), *problem.latent_form())
    assert len(meta.calls) == 1


def test_a_new_layout_gets_its_own_prepared_call(kernel_device):
    problem = Problem([21, 4], [7, 2], heads=2, page_size=8, seed=3, device=kernel_device)
    meta = problem.plan()
    want = problem.latent_form()
    flat = _prefill(problem, meta, check_inputs=False)
    with_head_axis = mlakit.mla_prefill(problem.q, problem.batch.kv_cache.unsqueeze(2), problem.weight, meta,
                                        softmax_scale=problem.scale, backend="triton", check_inputs=False)
    strided_q = torch.cat([problem.q, problem.q], dim=-1)[..., : problem.q.shape[-1]]
    from_a_view = mlakit.mla_prefill(strided_q, problem.batch.kv_cache, problem.weight, meta,
                                     softmax_scale=problem.scale, backend="triton", check_inputs=False)
    assert len(meta.calls) == 3
    for out, lse in (flat, with_head_axis, from_a_view):
        _assert_matches(out, lse, *want)
    again = _prefill(problem, meta, check_inputs=False)
    assert torch.equal(again[0], flat[0])


def test_scales_that_need_a_check_skip_the_prepared_call(kernel_device):
    problem = Problem([9], [4], heads=2, page_size=8, seed=5, device=kernel_device)
    meta = problem.plan()
    _prefill(problem, meta, check_inputs=False)
    for scale in (float("nan"), -1.0, 0, float("inf")):
        with pytest.raises(mlakit.MLAInputError, match="softmax_scale"):
            mlakit.mla_prefill(problem.q, problem.batch.kv_cache, problem.weight, meta, softmax_scale=scale,
                               backend="triton", check_inputs=False)
    whole = mlakit.mla_prefill(problem.q, problem.batch.kv_cache, problem.weight, meta, backend="triton",
                               softmax_scale=1, check_inputs=False)  # an int: checked, then the prepared call
    problem.scale = 1.0
    _assert_matches(*whole, *problem.latent_form())


def test_what_the_prepared_path_declines(kernel_device):
    """fp8 caches, a weight of another dtype than the cache and pages at a stride take the torch gather; a
    pass without key rows (no plan makes one) is not prepared. Each still gives the right answer."""
    fp8 = Problem([13, 2], [3, 5], heads=2, page_size=8, kv_dtype="fp8_e4m3", exact_decompression=False, seed=6,
                  device=kernel_device)
    float32_weight = Problem([13, 2], [3, 5], heads=2, page_size=8, w_dtype=torch.float32, seed=7,
                             device=kernel_device)
    for problem in (fp8, float32_weight):
        meta = problem.plan()
        assert prepare_prefill(meta, problem.q, problem.batch.kv_cache, problem.weight, problem.batch.kv_scale) is None
        for _ in range(2):
            out, lse = mlakit.mla_prefill(problem.q, problem.batch.kv_cache, problem.weight, meta,
                                          softmax_scale=problem.scale, kv_scale=problem.batch.kv_scale,
                                          backend="triton", check_inputs=False)
        assert not meta.calls
        _assert_matches(out, lse, *problem.latent_form(), lse_tol=problem.score_rounding_bound() + 1e-4)
    problem = Problem([13, 2], [3, 5], heads=2, page_size=8, seed=8, device=kernel_device)
    cache = problem.batch.kv_cache
    spaced = torch.empty(cache.shape[0], 2 * cache.shape[1], cache.shape[2], dtype=cache.dtype, device=cache.device)
    spaced[:, : cache.shape[1]] = cache
    strided = spaced[:, : cache.shape[1]]  # each page followed by a page's worth of other memory
    assert fused_rows(strided, None, problem.weight, problem.q.dtype) is None
    meta = problem.plan()
    _assert_matches(*mlakit.mla_prefill(problem.q, strided, problem.weight, meta, softmax_scale=problem.scale,
                                        backend="triton", check_inputs=False), *problem.latent_form())
    batch = len(problem.new)
    no_rows = KeyRows(Segments((0,) * batch, torch.zeros(batch + 1, dtype=torch.int32, device=kernel_device)),
                      (0,) * batch, torch.zeros(0, dtype=torch.int64, device=kernel_device))
    with_an_empty_chunk = PrefillMetadata(meta.queries, meta.causal_keys, (no_rows,), meta.page_size)
    assert prepare_prefill(with_an_empty_chunk, problem.q, cache, problem.weight, None) is None
    assert prepare_prefill(meta, problem.q, cache, problem.weight, None) is not None


def test_large_passes_take_the_torch_gather(kernel_device, monkeypatch):
    problem = Problem([40, 3], [6, 2], heads=3, page_size=8, seed=9, device=kernel_device)
    meta = problem.plan()
    rows = fused_rows(problem.batch.kv_cache, None, problem.weight, problem.q.dtype)
    slots = meta.causal_keys.slots
    monkeypatch.setattr(prepared, "FUSED_GATHER_LIMIT", 3 * slots.shape[0])
    fused = prepared.plan_gather(rows, slots, problem.weight, 3, 16)
    monkeypatch.setattr(prepared, "FUSED_GATHER_LIMIT", 3 * slots.shape[0] - 1)
    assert prepared.plan_gather(rows, slots, problem.weight, 3, 16) == TorchGather(3, 16)
    assert not isinstance(fused, TorchGather)
    for a, b in zip(fused(rows, slots, problem.weight), TorchGather(3, 16)(rows, slots, problem.weight)):
        assert a.shape == b.shape and a.stride()[1:] == b.stride()[1:]
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("chunk", [None, 24], ids=["one-pass", "chunked"])
def test_prepared_call_at_deepseek_widths(chunk, kernel_device):
    """DeepSeek's widths (where an SM90 GPU runs the Hopper kernel fed by the gather's addresses)."""
    problem = Problem([40, 0], [5, 3], heads=1, page_size=16, d_nope=128, d_v=128, kv_lora_rank=512, rope_dim=64,
                      exact_decompression=False, seed=12, device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=chunk)
    checked = _prefill(problem, meta)
    for _ in range(2):
        out, lse = _prefill(problem, meta, check_inputs=False)
        assert torch.equal(out, checked[0]) and torch.equal(lse, checked[1])
    _assert_matches(out, lse, *problem.latent_form(), lse_tol=problem.score_rounding_bound() + 1e-4)


def test_gather_matrices_are_the_views_as_tma_reads_them(kernel_device):
    from mlakit.kernels.gather_decompress import plan_gather
    from mlakit.kernels.hopper_prefill import head_rows

    rows = torch.randn(50, 40, device=kernel_device).to(torch.bfloat16)
    weight = torch.randn(3 * 40, 32, device=kernel_device).to(torch.bfloat16)
    slots = torch.tensor([4, 9, 1], device=kernel_device)
    launch = plan_gather(rows, slots, weight, heads=3, nope_dim=16)
    buf = launch.buffer(rows.device)
    assert launch.matrices(buf) == tuple(head_rows(view) for view in launch.views(buf))


def test_scales_of_any_real_type_take_the_one_prepared_call(kernel_device, monkeypatch):
    np = pytest.importorskip("numpy")
    problem = Problem([9, 3], [4, 2], heads=2, page_size=8, seed=13, device=kernel_device)
    meta = problem.plan()
    prepares = []
    real_prepare = prepared.prepare_prefill
    monkeypatch.setattr(prepared, "prepare_prefill", lambda *args: prepares.append(1) or real_prepare(*args))
    results = [mlakit.mla_prefill(problem.q, problem.batch.kv_cache, problem.weight, meta, softmax_scale=scale,
                                  backend="triton", check_inputs=False)
               for scale in (np.float64(problem.scale), np.float32(problem.scale), float(np.float32(problem.scale)))]
    assert len(prepares) == 1 and len(meta.calls) == 1
    assert torch.equal(results[1][0], results[2][0]) and torch.equal(results[1][1], results[2][1])


def test_preparing_computes_nothing(kernel_device, monkeypatch):
    """Planning reads layouts only: no gather runs (its buffers are planned unwritten), so the first call of a
    step costs one gather a pass, like every later one."""
    problem = Problem([60, 0, 13], [6, 4, 0], heads=5, page_size=4, seed=14, device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=16)
    runs = []
    for kind in (prepared.TorchGather, gather_decompress.GatherLaunch):
        original = kind.__call__
        monkeypatch.setattr(kind, "__call__", lambda self, *args, original=original: runs.append(self) or original(self, *args))
    monkeypatch.setattr(gather_decompress.GatherLaunch, "launch", lambda *args: runs.append(args) or None)
    for limit in (prepared.FUSED_GATHER_LIMIT, 0):
        monkeypatch.setattr(prepared, "FUSED_GATHER_LIMIT", limit)
        assert prepare_prefill(meta, problem.q, problem.batch.kv_cache, problem.weight, None) is not None
    assert runs == []


def test_the_fused_passes_share_one_held_buffer(kernel_device):
    """The fused gathers write one buffer the prepared call holds (as large as the largest pass), so no call
    allocates one and the attention reads addresses that stay valid; each pass's keys are views made once."""
    problem = Problem([60, 0, 13], [6, 4, 0], heads=5, page_size=4, seed=15, device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=16)
    run = prepare_prefill(meta, problem.q, problem.batch.kv_cache, problem.weight, None)
    held = [step for step in run.passes if isinstance(step, prepared._HeldPass)]
    assert len(held) == len(meta.passes) > 1
    storages = {step.buffer.untyped_storage().data_ptr() for step in held}
    assert len(storages) == 1
    largest = max(step.gather.m * step.gather.width for step in held)
    assert held[0].buffer.untyped_storage().nbytes() == largest * held[0].buffer.element_size()
    for step in held:
        assert step.buffer.shape == (step.gather.m, step.gather.width)
    alive = weakref.ref(held[0].buffer)
    del held
    gc.collect()
    assert alive() is not None  # the prepared call keeps it
    for _ in range(2):  # every pass rewrites the shared buffer before its attention reads it
        _assert_matches(*run(problem.q, problem.batch.kv_cache, problem.weight, None, problem.scale),
                        *problem.latent_form())


@pytest.mark.parametrize("check_inputs", [True, False], ids=["checked", "prepared"])
@pytest.mark.parametrize("chunk", [None, 16, 8], ids=["one-pass", "chunked-16-bit", "chunked-float32"])
def test_out_and_lse_given_are_written_in_place(chunk, check_inputs, kernel_device):
    """Engines pass preallocated outputs: they are filled (a prefix in 4 chunks merged in them, one in 8 in a
    float32 result, then copied) and returned, equal to the allocating call's results."""
    problem = Problem([60, 0, 13], [6, 4, 0], heads=5, page_size=4, seed=16, device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=chunk)
    want_out, want_lse = _prefill(problem, meta)
    for _ in range(2):  # the second prepared call runs what the first kept
        out = torch.full_like(want_out, float("nan"))
        lse = torch.full_like(want_lse, float("nan"))
        got_out, got_lse = _prefill(problem, meta, check_inputs=check_inputs, out=out, lse=lse)
        assert got_out is out and got_lse is lse
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    only_out = torch.empty_like(want_out)
    got_out, got_lse = _prefill(problem, meta, check_inputs=check_inputs, out=only_out)
    assert got_out is only_out and torch.equal(only_out, want_out) and torch.equal(got_lse, want_lse)


def test_out_and_lse_given_to_a_backend_that_cannot_write_them_are_copied(kernel_device):
    problem = Problem([21, 4], [7, 2], heads=2, page_size=8, seed=17, device=kernel_device)
    meta = problem.plan()
    out, lse = torch.empty(9, 2, 16, dtype=problem.q.dtype, device=kernel_device), torch.empty(9, 2, device=kernel_device)
    got = mlakit.mla_prefill(problem.q, problem.batch.kv_cache, problem.weight, meta, softmax_scale=problem.scale,
                             backend="reference", out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    _assert_matches(out, lse, *problem.latent_form())


@pytest.mark.parametrize("check_inputs", [True, False], ids=["checked", "unchecked"])
def test_outputs_of_the_wrong_layout_are_refused_by_name(check_inputs, kernel_device):
    problem = Problem([21, 4], [7, 2], heads=2, page_size=8, seed=18, device=kernel_device)
    meta = problem.plan()
    tokens, dtype = 9, problem.q.dtype
    bad = {
        "out": [torch.empty(tokens, 2, 17, dtype=dtype, device=kernel_device),  # d_v is 16
                torch.empty(tokens, 2, 16, dtype=torch.float32, device=kernel_device),
                torch.empty(tokens, 16, 2, dtype=dtype, device=kernel_device).transpose(1, 2)],
        "lse": [torch.empty(tokens, 3, device=kernel_device), torch.empty(tokens, 2, dtype=dtype, device=kernel_device),
                torch.empty(2, tokens, device=kernel_device).t()],
    }
    for name, tensors in bad.items():
        for tensor in tensors:
            with pytest.raises(mlakit.MLAInputError, match=f"^{name}: expected"):
                _prefill(problem, meta, check_inputs=check_inputs, **{name: tensor})
    assert not meta.calls


@pytest.mark.parametrize("check_inputs", [True, False], ids=["checked", "prepared"])
@pytest.mark.parametrize("chunk", [None, 16, 8], ids=["one-pass", "chunked-16-bit", "chunked-float32"])
def test_lse_given_without_out(chunk, check_inputs, kernel_device):
    problem = Problem([60, 0, 13], [6, 4, 0], heads=5, page_size=4, seed=19, device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=chunk)
    want_out, want_lse = _prefill(problem, meta)
    for _ in range(2):
        lse = torch.full_like(want_lse, float("nan"))
        got_out, got_lse = _prefill(problem, meta, check_inputs=check_inputs, lse=lse)
        assert got_lse is lse and torch.equal(lse, want_lse) and torch.equal(got_out, want_out)


@pytest.mark.parametrize("chunk", [None, 16, 8], ids=["one-pass", "chunked-16-bit", "chunked-float32"])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_strided_outputs_are_written_where_they_are_and_nowhere_else(offset, chunk, kernel_device):
    """out rows at a stride (a wider buffer's columns), possibly one element off 16-byte alignment, and lse
    columns of a wider buffer: written in place, the bytes around them untouched."""
    problem = Problem([60, 0, 13], [6, 4, 0], heads=5, page_size=4, seed=20, device=kernel_device)
    meta = problem.plan(prefix_chunk_tokens=chunk)
    want_out, want_lse = _prefill(problem, meta)
    tokens, heads, d_v = want_out.shape
    for _ in range(2):
        wide_out = torch.full((tokens * heads * (d_v + 3) + 8,), float("nan"), dtype=want_out.dtype,
                              device=kernel_device)
        out = wide_out[offset: offset + tokens * heads * (d_v + 3)].view(tokens, heads, d_v + 3)[..., :d_v]
        wide_lse = torch.full((tokens, heads + 2), float("nan"), device=kernel_device)
        lse = wide_lse[:, 1: heads + 1]
        got_out, got_lse = _prefill(problem, meta, check_inputs=False, out=out, lse=lse)
        assert got_out is out and torch.equal(out, want_out) and torch.equal(lse, want_lse)
        assert torch.isnan(wide_out.view(-1)[offset:][: tokens * heads * (d_v + 3)].view(tokens, heads, d_v + 3)
                           [..., d_v:]).all()
        assert torch.isnan(wide_lse[:, 0]).all() and torch.isnan(wide_lse[:, -1]).all()


@pytest.mark.gpu
def test_a_call_inside_graph_capture_runs_unprepared():
    """Preparing inside capture would leave the persistent kernel's counters zeroed only on replay: such a call
    runs unprepared (its graph replays the same result), and the next eager call prepares."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    problem = Problem([300, 0, 40], [200, 130, 9], heads=5, page_size=16, d_nope=64, d_v=64, rope_dim=32, seed=21,
                      device="cuda")
    meta = problem.plan(prefix_chunk_tokens=128)
    want_out, want_lse = _prefill(problem, meta)
    out, lse = torch.full_like(want_out, float("nan")), torch.full_like(want_lse, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _prefill(problem, meta, check_inputs=False, out=out, lse=lse)
    assert not meta.calls
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    eager_out, eager_lse = _prefill(problem, meta, check_inputs=False)
    assert len(meta.calls) == 1 and torch.equal(eager_out, want_out) and torch.equal(eager_lse, want_lse)
