"""mlakit.compat.flashinfer on the CPU (reference backend): FlashInfer's plan()/run() call forms
against mlakit's reference on fresh random steps, CUDA-graph-mode bookkeeping, and every refusal."""

import dataclasses

import pytest
import torch

from flashinfer_inputs import assert_matches, fp8_cache, make_step, reference
from mlakit.compat.flashinfer import BatchMLAPagedAttentionWrapper, MLAPlanMetadata, _adjacent_view
from mlakit.errors import MLAInputError

WORKSPACE = torch.empty(1 << 10, dtype=torch.uint8)


def planned(step, *, causal=True, wrapper=None, kv_data_type=None, **plan_kwargs):
    wrapper = wrapper or BatchMLAPagedAttentionWrapper(WORKSPACE)
    wrapper.plan(*step.csr(), *step.plan_args(causal, kv_data_type), **plan_kwargs)
    return wrapper


def run_legacy(wrapper, step, **kwargs):
    return wrapper.run(*step.split_query(), *step.split_cache(), **kwargs)


@pytest.mark.parametrize(
    ("kv_lens", "q_lens", "heads", "page_size"),
    [
        ([37, 0, 5, 130], [1, 1, 1, 1], 16, 16),     # zero length among ragged lengths
        ([64, 1, 200], [1, 1, 1], 5, 64),            # odd head count
        ([9, 3, 17], [2, 2, 2], 3, 1),               # page size 1, two query tokens each
        ([50, 20], [8, 8], 4, 16),                   # eight query tokens each
        ([40, 7, 33, 12], [1, 4, 2, 3], 7, 16),      # ragged query lengths: the extend path
        ([70, 0, 9], [3, 1, 2], 2, 64),              # ragged with an empty cache
    ],
)
def test_matches_reference(kv_lens, q_lens, heads, page_size):
    step = make_step(kv_lens, q_lens, heads=heads, page_size=page_size, seed=len(kv_lens) + heads)
    out, lse = run_legacy(planned(step), step, return_lse=True)
    assert out.shape == (sum(q_lens), heads, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (sum(q_lens), heads) and lse.dtype == torch.float32
    assert_matches(out, lse, reference(step))


@pytest.mark.parametrize("q_lens", [[3, 1, 2], [2, 2, 2], [1, 1, 1]])
def test_non_causal_queries_see_the_whole_cache(q_lens):
    step = make_step([30, 5, 18], q_lens, heads=4, page_size=16, seed=3)
    out, lse = run_legacy(planned(step, causal=False), step, return_lse=True)
    assert_matches(out, lse, reference(step, causal=False))


@pytest.mark.parametrize(("ckv", "kpe"), [(256, 32), (128, 64), (96, 16)])
def test_other_latent_widths(ckv, kpe):
    step = make_step([33, 4], [2, 2], heads=3, page_size=8, head_dim_ckv=ckv, head_dim_kpe=kpe, seed=ckv)
    out, lse = run_legacy(planned(step), step, return_lse=True)
    assert out.shape == (4, 3, ckv)
    assert_matches(out, lse, reference(step))


def test_fp16():
    step = make_step([25, 3], [1, 1], heads=4, page_size=16, dtype=torch.float16)
    out, lse = run_legacy(planned(step), step, return_lse=True)
    assert out.dtype == torch.float16
    assert_matches(out, lse, reference(step))


def test_lse_in_natural_log_on_request():
    step = make_step([25, 0], [1, 1], heads=4, page_size=16)
    out, lse = run_legacy(planned(step), step, return_lse=True, return_lse_base_on_e=True)
    assert_matches(out, lse, reference(step), base2=False)


def test_return_forms_and_preallocated_outputs():
    step = make_step([25, 9], [2, 2], heads=4, page_size=16)
    wrapper = planned(step)
    alone = run_legacy(wrapper, step)
    assert isinstance(alone, torch.Tensor)
    out = torch.full((4, 4, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((4, 4), float("nan"))
    got_out, got_lse = run_legacy(wrapper, step, out=out, lse=lse, return_lse=True)
    assert got_out is out and got_lse is lse
    assert torch.equal(out, alone)
    assert_matches(out, lse, reference(step))
    lse_only = torch.full((4, 4), float("nan"))
    assert run_legacy(wrapper, step, lse=lse_only) is not None
    assert torch.equal(lse_only, lse)  # lse= is filled even without return_lse, as FlashInfer does


def test_one_plan_serves_every_layer():
    first = make_step([41, 6, 0], [1, 3, 2], heads=4, page_size=16, seed=4)
    wrapper = planned(first)
    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        fresh = torch.randn(first.cache.shape, generator=gen).to(first.cache.dtype)
        layer = dataclasses.replace(
            first, cache=torch.where(first.cache.isnan(), first.cache, fresh),
            q=torch.randn(first.q.shape, generator=gen).to(first.q.dtype),
        )
        out, lse = wrapper.run(query=layer.q, kv_cache=layer.cache, return_lse=True)
        assert_matches(out, lse, reference(layer))


def test_plan_forms_and_run_forms_agree():
    step = make_step([45, 2, 17], [2, 1, 3], heads=4, page_size=16, seed=5)
    rest = dict(num_heads=4, head_dim_ckv=512, head_dim_kpe=64, page_size=16, causal=True, sm_scale=step.sm_scale,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    plans = [
        dict(qo_indptr=step.qo_indptr, kv_indptr=step.kv_indptr, kv_indices=step.kv_indices, kv_len_arr=step.kv_len_arr),
        dict(metadata=MLAPlanMetadata.csr(*step.csr())),
        dict(metadata=MLAPlanMetadata.dense(step.qo_indptr, step.block_table, step.kv_len_arr, max_q_len=3)),
        dict(cum_seq_lens_q=step.qo_indptr, block_tables=step.block_table, seq_lens=step.kv_len_arr),
    ]
    q_nope, q_pe = step.split_query()
    ckv, kpe = step.split_cache()
    runs = [
        dict(q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv, kpe_cache=kpe),
        dict(query=step.q, kv_cache=step.cache),
        dict(query=(q_nope, q_pe), kv_cache=(ckv, kpe)),
        dict(query=(q_nope.clone(), q_pe.clone()), kv_cache=step.cache),  # separate query allocations are joined by a copy
    ]
    expected = run_legacy(planned(step), step)
    for plan_kwargs in plans:
        wrapper = BatchMLAPagedAttentionWrapper(WORKSPACE)
        wrapper.plan(**plan_kwargs, **rest)
        for run_kwargs in runs:
            assert torch.equal(wrapper.run(**run_kwargs), expected)


def test_joined_query_and_cache_are_views_not_copies():
    step = make_step([20], [1], heads=2, page_size=16)
    for whole in (step.q, step.cache):
        left, right = whole[..., :512], whole[..., 512:]
        joined = _adjacent_view(left, right)
        assert joined is not None and joined.data_ptr() == whole.data_ptr()
        assert (joined.shape, joined.stride()) == (whole.shape, whole.stride())
        assert _adjacent_view(left.clone(), right.clone()) is None
        assert _adjacent_view(whole[..., :256], whole[..., 300:]) is None


@pytest.mark.parametrize(("ckv_scale", "kpe_scale"), [(0.5, 0.5), (0.25, 0.0625)])
def test_fp8_cache_with_flashinfer_scales(ckv_scale, kpe_scale):
    step = make_step([37, 0, 80], [1, 2, 2], heads=4, page_size=16, seed=7)
    stored, dequantized = fp8_cache(step, ckv_scale, kpe_scale)
    wrapper = planned(step, kv_data_type=torch.float8_e4m3fn)
    out, lse = wrapper.run(*step.split_query(), stored[..., :512], stored[..., 512:], return_lse=True,
                           ckv_scale=ckv_scale, kpe_scale=kpe_scale)
    assert_matches(out, lse, reference(step, cache=dequantized), lse_tol=2e-2)


def test_fp8_cache_with_mlakit_kv_scale():
    step = make_step([37, 5], [1, 1], heads=4, page_size=16, seed=8)
    stored, dequantized = fp8_cache(step, 0.5, 0.5)
    wrapper = planned(step, kv_data_type=torch.float8_e4m3fn)
    out, lse = wrapper.run(query=step.q, kv_cache=stored, kv_scale=torch.tensor([0.5]), return_lse=True)
    assert_matches(out, lse, reference(step, cache=dequantized), lse_tol=2e-2)


def graph_wrapper(batch, capacity=64, **kwargs):
    buffers = dict(qo_indptr=torch.zeros(batch + 1, dtype=torch.int32), kv_indptr=torch.zeros(batch + 1, dtype=torch.int32),
                   kv_indices=torch.zeros(capacity, dtype=torch.int32), kv_len_arr=torch.zeros(batch, dtype=torch.int32))
    return BatchMLAPagedAttentionWrapper(WORKSPACE, True, **buffers, **kwargs), buffers


@pytest.mark.parametrize("q_lens", [[1, 1, 1], [2, 1, 3]])
def test_cuda_graph_mode_replans_into_fixed_buffers(q_lens):
    wrapper, buffers = graph_wrapper(3)
    first = make_step([30, 0, 12], q_lens, heads=4, page_size=16, seed=1)
    planned(first, wrapper=wrapper)
    held = wrapper._step
    assert torch.equal(buffers["qo_indptr"], first.qo_indptr) and torch.equal(buffers["kv_len_arr"], first.kv_len_arr)
    assert torch.equal(buffers["kv_indptr"], first.kv_indptr)
    assert torch.equal(buffers["kv_indices"][: first.kv_indices.shape[0]], first.kv_indices)
    second = make_step([5, 60, 33], q_lens, heads=4, page_size=16, seed=2)
    planned(second, wrapper=wrapper)
    now = wrapper._step
    assert now.block_table.data_ptr() == held.block_table.data_ptr()
    assert now.cache_seqlens.data_ptr() == held.cache_seqlens.data_ptr()
    assert torch.equal(now.cache_seqlens, second.kv_len_arr)
    out, lse = wrapper.run(query=second.q, kv_cache=second.cache, return_lse=True)
    assert_matches(out, lse, reference(second))


def test_cuda_graph_mode_limits():
    wrapper, _ = graph_wrapper(2, capacity=64, max_pages_per_request=2)
    planned(make_step([30, 4], [1, 1], heads=4, page_size=16), wrapper=wrapper)
    with pytest.raises(MLAInputError, match="^qo_indptr: a CUDA-graph wrapper keeps"):
        planned(make_step([30, 4], [2, 2], heads=4, page_size=16), wrapper=wrapper)
    with pytest.raises(MLAInputError, match="^max_pages_per_request:"):
        planned(make_step([40, 4], [1, 1], heads=4, page_size=16), wrapper=wrapper)
    with pytest.raises(MLAInputError, match=r"^plan\(\): a CUDA-graph wrapper keeps its first plan"):
        planned(make_step([30, 4], [1, 1], heads=8, page_size=16), wrapper=wrapper)
    with pytest.raises(MLAInputError, match="^kv_len_arr: the CUDA-graph buffers hold 2"):
        planned(make_step([30, 4, 5], [1, 1, 1], heads=4, page_size=16), wrapper=wrapper)
    small, _ = graph_wrapper(2, capacity=2)
    with pytest.raises(MLAInputError, match="^kv_indices: the fixed buffer holds 2"):
        planned(make_step([30, 4], [1, 1], heads=4, page_size=16), wrapper=small)


@pytest.mark.parametrize(("refused_by", "kv_lens", "q_lens", "heads"), [
    ("qo_indptr", [5, 12], [2, 1], 4),
    ("max_pages_per_request", [40, 9], [1, 1], 4),
    ("kv_len_arr", [7, 30, 9], [1, 1, 1], 4),
    (r"plan\(\)", [7, 30], [1, 1], 8),
])
def test_cuda_graph_mode_refused_plans_leave_the_buffers_and_the_step_as_they_were(refused_by, kv_lens, q_lens, heads):
    """Each refused re-plan has other lengths and pages than the accepted plan, so that a write would show."""
    wrapper, buffers = graph_wrapper(2, capacity=8, max_pages_per_request=2)
    step = make_step([20, 3], [1, 1], heads=4, page_size=16, seed=10)
    planned(step, wrapper=wrapper)
    before = {name: buffer.clone() for name, buffer in buffers.items()}
    out, lse = wrapper.run(query=step.q, kv_cache=step.cache, return_lse=True)
    with pytest.raises(MLAInputError, match=f"^{refused_by}:"):
        planned(make_step(kv_lens, q_lens, heads=heads, page_size=16, seed=11), wrapper=wrapper)
    for name, buffer in buffers.items():
        assert torch.equal(buffer, before[name]), name
    again, again_lse = wrapper.run(query=step.q, kv_cache=step.cache, return_lse=True)
    assert torch.equal(again, out) and torch.equal(again_lse, lse)


@dataclasses.dataclass(frozen=True)
class _SplitPlan:
    """A backend's per-step metadata as the triton backend's: a device tensor, then a host value."""

    num_splits: torch.Tensor
    kv_tokens: int


def test_cuda_graph_mode_checks_the_whole_split_plan_before_refilling_it(monkeypatch):
    """A re-plan that changes a host value of the split plan is refused before any of its tensors is refilled."""
    from mlakit.compat import flashinfer

    original = flashinfer.mla_decode_metadata
    monkeypatch.setattr(flashinfer, "mla_decode_metadata", lambda lengths, **kwargs: dataclasses.replace(
        original(lengths, **kwargs), data=_SplitPlan(lengths.clone(), int(lengths.sum()))))
    wrapper, buffers = graph_wrapper(2, capacity=8)
    step = make_step([20, 3], [1, 1], heads=4, page_size=16, seed=10)
    planned(step, wrapper=wrapper)
    before = {name: buffer.clone() for name, buffer in buffers.items()}
    with pytest.raises(MLAInputError, match=r"^plan\(\): the re-plan changed the captured split plan's kv_tokens"):
        planned(make_step([5, 12], [1, 1], heads=4, page_size=16, seed=11), wrapper=wrapper)
    assert torch.equal(wrapper._step.metadata.data.num_splits, step.kv_len_arr)
    assert torch.equal(wrapper._step.cache_seqlens, step.kv_len_arr)
    assert all(torch.equal(buffer, before[name]) for name, buffer in buffers.items())


def test_cuda_graph_mode_refills_a_split_plan_told_other_cached_tokens():
    """The triton backend's split plans of two steps whose cached tokens differ: their `unit_tiles_hint` (a speed hint
    the plan derives from `kv_tokens_hint`) differs, and the re-plan is refilled, not refused; the captured graph keeps
    the kernels the first plan chose."""
    from mlakit.compat import flashinfer
    from mlakit.kernels.triton_decode import plan_decode

    lengths = torch.tensor([20, 3], dtype=torch.int32)
    first, second = (plan_decode(lengths, q_len=1, heads=4, kv_tokens_hint=hint) for hint in (23, 1 << 20))
    assert first.unit_tiles_hint != second.unit_tiles_hint
    flashinfer._check_refillable(first, second)


def test_cuda_graph_mode_keeps_the_first_plans_kv_scale_layout():
    wrapper, _ = graph_wrapper(2, capacity=64)
    step = make_step([30, 4], [1, 1], heads=4, page_size=64)
    planned(step, wrapper=wrapper, kv_data_type=torch.float8_e4m3fn)
    keeps = r"^plan\(\): a CUDA-graph wrapper keeps its first plan.*kv_scale_layout='tensor'"
    with pytest.raises(MLAInputError, match=keeps):
        planned(step, wrapper=wrapper, kv_data_type=torch.float8_e4m3fn, kv_scale_layout="group")


@pytest.mark.parametrize("missing", ["qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"])
def test_cuda_graph_mode_needs_every_buffer(missing):
    buffers = dict(qo_indptr=torch.zeros(3, dtype=torch.int32), kv_indptr=torch.zeros(3, dtype=torch.int32),
                   kv_indices=torch.zeros(8, dtype=torch.int32), kv_len_arr=torch.zeros(2, dtype=torch.int32))
    buffers[missing] = None
    with pytest.raises(MLAInputError, match=f"^{missing}: expected an int32 tensor"):
        BatchMLAPagedAttentionWrapper(WORKSPACE, use_cuda_graph=True, **buffers)


def test_cuda_graph_buffers_name_what_sizes_the_page_table():
    """The fixed page table's width is `max_pages_per_request`, else `kv_indices`' capacity: a bad width names
    whichever the caller gave."""
    buffers = dict(qo_indptr=torch.zeros(3, dtype=torch.int32), kv_indptr=torch.zeros(3, dtype=torch.int32),
                   kv_indices=torch.zeros(0, dtype=torch.int32), kv_len_arr=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(MLAInputError, match=r"^kv_indices: expected room for at least one page .*, got a torch.int32"):
        BatchMLAPagedAttentionWrapper(WORKSPACE, use_cuda_graph=True, **buffers)
    buffers["kv_indices"] = torch.zeros(8, dtype=torch.int32)
    with pytest.raises(MLAInputError, match=r"^max_pages_per_request: expected an integer >= 1, got 0$"):
        BatchMLAPagedAttentionWrapper(WORKSPACE, use_cuda_graph=True, max_pages_per_request=0, **buffers)


def test_backend_names():
    assert BatchMLAPagedAttentionWrapper(WORKSPACE, backend="fa3").backend == "reference"
    assert BatchMLAPagedAttentionWrapper(WORKSPACE, backend="reference").backend == "reference"
    for backend in ("fa4", ["fa3"]):
        with pytest.raises(MLAInputError, match=r"^backend: expected one of .*, got "):
            BatchMLAPagedAttentionWrapper(WORKSPACE, backend=backend)


STEP = make_step([30, 4], [1, 1], heads=4, page_size=16)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("profiler_buffer", dict(profiler_buffer=torch.zeros(1))),
        ("kv_len", dict(kv_len=STEP.kv_len_arr)),
        ("page_table", dict(page_table=STEP.block_table)),
        ("o_scale", dict(o_scale=1.0)),
        ("ckv_scale_arr", dict(ckv_scale_arr=torch.ones(1))),
        ("sinks", dict(sinks=torch.zeros(4))),
        ("skip_softmax_threshold_scale_factor", dict(skip_softmax_threshold_scale_factor=1.0)),
        ("bmm1_scale", dict(bmm1_scale=1.0, bmm2_scale=1.0)),
        ("ckv_scale", dict(ckv_scale=1.0, kpe_scale=1.0)),
        ("kv_scale", dict(kv_scale=torch.ones(1))),
        ("out", dict(out=torch.zeros(2, 4, 512))),
        ("lse", dict(lse=torch.zeros(4, 2))),
    ],
)
def test_run_refusals_name_the_argument(name, kwargs):
    with pytest.raises(MLAInputError, match=f"^{name}:"):
        run_legacy(planned(STEP), STEP, **kwargs)


MISMATCHES = [
        ("q_nope", lambda w: w.run(STEP.q[:1, :, :512], STEP.q[:1, :, 512:], *STEP.split_cache())),
        ("query", lambda w: w.run(query=STEP.q[:, :3], kv_cache=STEP.cache)),
        ("query", lambda w: w.run(query=STEP.q.half(), kv_cache=STEP.cache)),
        ("q_pe", lambda w: w.run(STEP.q[..., :512], STEP.q[..., 512:].half(), *STEP.split_cache())),
        ("kv_cache", lambda w: w.run(query=STEP.q, kv_cache=STEP.cache.half())),
        ("kv_cache", lambda w: w.run(query=STEP.q, kv_cache=STEP.cache.view(-1, 8, 576))),
        ("kv_cache", lambda w: w.run(query=STEP.q, kv_cache=STEP.cache[:1])),
        ("kpe_cache", lambda w: w.run(*STEP.split_query(), STEP.cache[..., :512], STEP.cache[..., 512:].clone())),
        ("kpe_cache", lambda w: w.run(*STEP.split_query(), STEP.cache[..., :512], STEP.cache[..., 500:])),
        ("kpe_cache", lambda w: w.run(*STEP.split_query(), STEP.cache[..., :512], None)),
        ("kv_cache", lambda w: w.run(query=STEP.q, kv_cache=STEP.cache, ckv_cache=STEP.cache)),
        ("query", lambda w: w.run(query=(STEP.q,), kv_cache=STEP.cache)),
        ("kpe_cache", lambda w: w.run(*STEP.split_query(), STEP.cache[..., :512], STEP.cache.clone()[..., 512:])),
        ("kpe_cache", lambda w: w.run(query=STEP.q, kv_cache=(STEP.cache[..., :512], STEP.cache.clone()[..., 512:]))),
        ("out", lambda w: w.run(query=STEP.q, kv_cache=STEP.cache, out=torch.zeros(2, 4, 512))),
        ("lse", lambda w: w.run(query=STEP.q, kv_cache=STEP.cache, lse=torch.zeros(4, 2).t())),
]


@pytest.mark.parametrize(("name", "call"), MISMATCHES)
def test_tensors_must_match_the_plan(name, call):
    with pytest.raises(MLAInputError, match=f"^{name}:"):
        call(planned(STEP))


@pytest.mark.parametrize(("name", "call"), MISMATCHES)
def test_tensors_must_match_the_plan_after_good_calls_of_every_form(name, call):
    """run() remembers what its checks decided per layout of its tensors: good calls in every form
    first, then the same mismatches (some of the same layout as a good call: parts of another
    buffer) still raise."""
    wrapper = planned(STEP)
    q_nope, q_pe = STEP.split_query()
    ckv, kpe = STEP.split_cache()
    out, lse = torch.empty(2, 4, 512, dtype=torch.bfloat16), torch.empty(2, 4)
    for _ in range(2):
        run_legacy(wrapper, STEP, out=out, lse=lse)
        wrapper.run(query=STEP.q, kv_cache=STEP.cache, out=out, lse=lse)
        wrapper.run(query=(q_nope, q_pe), kv_cache=(ckv, kpe), return_lse=True)
    with pytest.raises(MLAInputError, match=f"^{name}:"):
        call(wrapper)


def test_query_parts_of_separate_buffers_are_copied_after_a_joined_call():
    """The same layout of query parts, first as views of one buffer, then of two: joined, then copied."""
    step = make_step([30, 4, 17], [2, 2, 2], heads=4, page_size=16, seed=11)
    wrapper = planned(step)
    q_nope, q_pe = step.split_query()
    joined = wrapper.run(q_nope, q_pe, *step.split_cache(), return_lse=True)
    other_pe = step.q.clone()[..., 512:]
    assert (other_pe.stride(), other_pe.storage_offset()) == (q_pe.stride(), q_pe.storage_offset())
    copied = wrapper.run(q_nope, other_pe, *step.split_cache(), return_lse=True)
    for result in (joined, copied):
        assert_matches(*result, reference(step))


def test_a_replan_that_reads_past_the_cache_raises_for_a_known_layout():
    step = make_step([30, 4], [1, 1], heads=4, page_size=16)
    wrapper = planned(step)
    wrapper.run(query=step.q, kv_cache=step.cache)
    pages = step.cache.shape[0]
    wrapper.plan(step.qo_indptr, step.kv_indptr, torch.full_like(step.kv_indices, pages), step.kv_len_arr, *step.plan_args())
    with pytest.raises(MLAInputError, match=f"^kv_cache: the plan reads page {pages}, the cache holds {pages} pages"):
        wrapper.run(query=step.q, kv_cache=step.cache)


@pytest.mark.parametrize("first, second", [([1, 1, 1, 1], [2, 2]), ([2, 2], [1, 3]), ([1, 3], [1, 1, 1, 1])])
def test_replans_to_other_query_rows_run_right(first, second):
    """One wrapper re-planned from one shape of query rows to another with as many query tokens
    (decode rows of other lengths, or an extend): each run matches the reference."""
    wrapper = BatchMLAPagedAttentionWrapper(WORKSPACE)
    for seed, q_lens in enumerate((first, second, first)):
        step = make_step([40, 9, 20, 33][: len(q_lens)], q_lens, heads=4, page_size=16, seed=seed)
        planned(step, wrapper=wrapper)
        for _ in range(2):
            assert_matches(*run_legacy(wrapper, step, return_lse=True), reference(step))


def test_run_before_plan():
    with pytest.raises(MLAInputError, match=r"^run\(\): expected a plan\(\) first"):
        run_legacy(BatchMLAPagedAttentionWrapper(WORKSPACE), STEP)


def test_fp8_needs_its_scales():
    stored, _ = fp8_cache(STEP, 0.5, 0.5)
    wrapper = planned(STEP, kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(MLAInputError, match="^ckv_scale: expected a finite float > 0"):
        wrapper.run(query=STEP.q, kv_cache=stored)
    with pytest.raises(MLAInputError, match="^kpe_scale: expected a finite float > 0"):
        wrapper.run(query=STEP.q, kv_cache=stored, ckv_scale=0.5, kpe_scale=-1.0)
    with pytest.raises(MLAInputError, match="^kv_scale: pass either"):
        wrapper.run(query=STEP.q, kv_cache=stored, ckv_scale=0.5, kpe_scale=0.5, kv_scale=torch.ones(1))


def _plan_with(**overrides):
    args = dict(qo_indptr=STEP.qo_indptr, kv_indptr=STEP.kv_indptr, kv_indices=STEP.kv_indices, kv_len_arr=STEP.kv_len_arr,
                num_heads=4, head_dim_ckv=512, head_dim_kpe=64, page_size=16, causal=True, sm_scale=0.1,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    args.update(overrides)
    BatchMLAPagedAttentionWrapper(WORKSPACE).plan(**args)


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("use_profiler", dict(use_profiler=True)),
        ("skip_softmax", dict(skip_softmax=True)),
        ("use_sinks", dict(use_sinks=True)),
        ("output_scale", dict(output_scale="per-tensor")),
        ("scale_mode", dict(scale_mode="bmm-scalar")),
        ("kv_scale_layout", dict(kv_scale_layout="channel")),
        ("kv_scale_layout", dict(kv_scale_layout="group")),  # a bf16 cache has no scales
        ("kv_scale_layout", dict(kv_scale_layout="group", kv_data_type=torch.float8_e4m3fn, scale_mode="kv-per-tensor")),
        ("lse_mode", dict(lse_mode="base10")),
        ("query_layout", dict(query_layout="interleaved")),
        ("output_dtype", dict(output_dtype=torch.float32)),
        ("num_heads", dict(num_heads=0)),
        ("head_dim_kpe", dict(head_dim_kpe=None)),
        ("page_size", dict(page_size=2.0)),
        ("causal", dict(causal=1)),
        ("sm_scale", dict(sm_scale=float("nan"))),
        ("q_data_type", dict(q_data_type=torch.float32)),
        ("kv_data_type", dict(kv_data_type=torch.int8)),
        ("qo_indptr", dict(qo_indptr=torch.tensor([0, 1, 1], dtype=torch.int32) * 0)),
        ("qo_indptr", dict(qo_indptr=torch.tensor([0, 2, 1], dtype=torch.int32))),
        ("qo_indptr", dict(qo_indptr=torch.tensor([0, 1], dtype=torch.int32))),
        ("kv_indptr", dict(kv_indptr=STEP.kv_indptr.long())),
        ("kv_indices", dict(kv_indices=STEP.kv_indices[:1])),
        ("kv_indices", dict(kv_indices=-STEP.kv_indices - 1)),
        ("kv_indices", dict(kv_len_arr=torch.tensor([30, 40], dtype=torch.int32))),
        ("kv_len_arr", dict(kv_len_arr=torch.tensor([30, -1], dtype=torch.int32))),
        ("metadata", dict(metadata=MLAPlanMetadata.csr(*STEP.csr()))),
        ("metadata", dict(qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, metadata="x")),
        ("cum_seq_lens_q", dict(cum_seq_lens_q=STEP.qo_indptr)),
        ("qo_indptr", dict(qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None)),
        ("block_tables", dict(qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, cum_seq_lens_q=STEP.qo_indptr,
                              block_tables=STEP.block_table[:1], seq_lens=STEP.kv_len_arr)),
        # before: the dense form's negative length was blamed on kv_len_arr, its empty batch raised max()'s ValueError
        ("seq_lens", dict(qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, cum_seq_lens_q=STEP.qo_indptr,
                          block_tables=STEP.block_table, seq_lens=torch.tensor([30, -1], dtype=torch.int32))),
        ("seq_lens", dict(qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None,
                          metadata=MLAPlanMetadata.dense(torch.tensor([0], dtype=torch.int32), STEP.block_table[:0],
                                                         torch.tensor([], dtype=torch.int32)))),
        ("max_q_len", dict(qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None,
                           metadata=MLAPlanMetadata.dense(torch.tensor([0, 1, 3], dtype=torch.int32), STEP.block_table,
                                                          STEP.kv_len_arr, max_q_len=1))),
    ],
)
def test_plan_refusals_name_the_argument(name, overrides):
    with pytest.raises(MLAInputError, match=f"^{name}:"):
        _plan_with(**overrides)


@pytest.mark.parametrize(("q_lens", "causal", "tokens"), [([1, 1, 1], True, 48), ([3, 1, 2], True, 48),
                                                           ([3, 1, 2], False, 30 * 3 + 0 * 1 + 18 * 2)])
def test_plan_hints_the_steps_cached_tokens_from_its_host_lengths(monkeypatch, q_lens, causal, tokens):
    """`plan` knows the lengths on the host: the metadata builders get their sum (each row's, where a non-causal step
    runs one row per query token) as `kv_tokens_hint`, with no device read, and the planned page size as `page_size`."""
    hints = _metadata_hints(monkeypatch)
    step = make_step([30, 0, 18], q_lens, heads=4, page_size=64, seed=5)
    out, lse = run_legacy(planned(step, causal=causal), step, return_lse=True)
    assert hints == [(tokens, 64)]
    assert_matches(out, lse, reference(step, causal=causal))


@pytest.mark.parametrize("q_lens", [[1, 1, 1], [2, 1, 3]])
def test_cuda_graph_mode_hints_no_cached_tokens(monkeypatch, q_lens):
    """A CUDA-graph wrapper's decode and extend metadata is told no `kv_tokens_hint` (its captured kernels replay later
    plans' lengths, so they must not follow the first plan's tokens); the page size still, and the results stay the
    reference's."""
    hints = _metadata_hints(monkeypatch)
    wrapper, _ = graph_wrapper(3, capacity=8)
    step = make_step([30, 0, 18], q_lens, heads=4, page_size=64, seed=5)
    out, lse = run_legacy(planned(step, wrapper=wrapper), step, return_lse=True)
    assert hints == [(None, 64)]
    assert_matches(out, lse, reference(step))


@pytest.mark.parametrize(("kv_data_type", "page_size", "kv_scale_layout", "hint"), [
    (torch.bfloat16, 64, "tensor", 64), (torch.bfloat16, 16, "tensor", None),
    (torch.float8_e4m3fn, 128, "tensor", 128), (torch.float8_e4m3fn, 64, "group", None),
])
def test_plan_hints_the_page_size_only_where_the_persistent_kernel_reads_the_planned_cache(
    monkeypatch, kv_data_type, page_size, kv_scale_layout, hint
):
    """As `mlakit.decode_page_size_hint` over such a cache: whole 64-token tiles, bf16 or fp8 with one scale
    (`kv_scale_layout="group"` declares per-group scales, which that kernel does not read)."""
    hints = _metadata_hints(monkeypatch)
    step = make_step([30, 0, 18], [1, 1, 1], heads=4, page_size=page_size, seed=6)
    planned(step, kv_data_type=kv_data_type, kv_scale_layout=kv_scale_layout)
    assert [page for _, page in hints] == [hint]


def _metadata_hints(monkeypatch) -> list[tuple[int | None, int | None]]:
    """The (kv_tokens_hint, page_size) of each metadata the flashinfer drop-in builds from now on."""
    from mlakit.compat import flashinfer

    hints = []
    for name in ("mla_decode_metadata", "mla_extend_metadata"):
        original = getattr(flashinfer, name)
        monkeypatch.setattr(flashinfer, name,
                            lambda *args, _original=original, **kwargs:
                            hints.append((kwargs["kv_tokens_hint"], kwargs["page_size"])) or _original(*args, **kwargs))
    return hints
