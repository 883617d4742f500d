"""The Hopper (SM90) Gluon prefill kernel against the float32 oracle: ragged and empty segments,
q_len > k_len, odd head counts, NaN rows past the last segment, both causal modes, the merge into
an earlier result, DeepSeek's and MiniCPM3's widths, every tile / ring setting it takes, and the
refusals; every case also on the persistent form ("hopper_persistent"), on every SM and on two programs
that take many units each from the launch's counter (left at zero for the next launch, also across the
passes of a prepared prefill). Needs an SM90 GPU."""

from __future__ import annotations

import pytest
import torch

import mlakit
from mlakit.errors import MLAInputError
from mlakit.kernels import hopper_prefill, triton_prefill
from mlakit.kernels.triton_prefill import (HOPPER_TUNING, SHORT_HOPPER_TUNING, SHORT_PROMPT_TOKENS, PrefillTuning,
                                           _tuning_for, default_prefill_tuning, plan_attention, triton_mha_prefill)
from test_prefill import Problem, _assert_matches, _kernel_inputs, _oracle_pass, _segments

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                       reason="needs an SM90 GPU"),
]

DEVICE = "cuda"
WIDTHS = [(128, 64, 128), (64, 32, 64)]  # d_nope, d_rope, d_v
HOPPER_TUNINGS = [PrefillTuning(128, 128, 4, 2, kernel=kernel) for kernel in ("hopper", "hopper_persistent")]
TUNINGS = [*HOPPER_TUNINGS,
           *(PrefillTuning(128, block_n, 4, stages, kernel=kernel) for kernel in ("hopper", "hopper_persistent")
             for block_n, stages in ((64, 3), (64, 2))),
           PrefillTuning(128, 64, 8, 3)]  # the portable kernel's SM90 tiles, which mla_prefill no longer picks here
CASES = [
    # q_lens, k_lens, heads, causal
    ([5, 0, 17, 3], [5, 4, 17, 0], 3, True),  # empty query and key segments
    ([200, 6], [150, 6], 1, True),  # q_len > k_len: rows that see no key, across warpgroups and tiles
    ([300, 130, 1], [300, 400, 700], 5, True),  # a prefix: k_len > q_len, several row blocks and tiles
    ([129, 64, 65], [129, 64, 65], 3, True),  # row counts at the warpgroup and program edges
    ([33, 1, 0, 250], [500, 0, 9, 250], 3, False),
    ([127, 128], [255, 256], 2, False),  # key counts at tile edges
    ([700, 300], [900, 300], 12, True),  # more units (6 row blocks x 12 heads x 2) than an H100's 132 SMs
]


def _run(q_lens, k_lens, heads, widths, causal, tuning, dtype, seed):
    d_nope, d_rope, d_v = widths
    q, k_nope, k_pe, v = _kernel_inputs(q_lens, k_lens, heads, d_nope, d_rope, d_v, dtype, seed=seed, device=DEVICE)
    assert hopper_prefill.supports(q, k_nope, k_pe, v)
    queries, keys = _segments(q_lens, DEVICE), _segments(k_lens, DEVICE)
    scale = (d_nope + d_rope) ** -0.5
    out, lse = triton_mha_prefill(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=queries.max_len,
                                  causal=causal, softmax_scale=scale, tuning=tuning)
    expected = _oracle_pass(q.float(), k_nope.float(), k_pe.float(), v.float(), queries, keys, causal=causal,
                            softmax_scale=scale)
    return out, lse, expected, sum(q_lens)


@pytest.mark.parametrize("tuning", TUNINGS, ids=lambda t: f"{t.kernel}-n{t.block_n}s{t.num_stages}")
@pytest.mark.parametrize("widths", WIDTHS, ids=lambda w: "x".join(map(str, w)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("q_lens, k_lens, heads, causal", CASES)
def test_sm90_kernels_match_float32_oracle(q_lens, k_lens, heads, causal, dtype, widths, tuning):
    seed = sum(q_lens) + 3 * sum(k_lens) + heads + tuning.block_n + widths[0]
    out, lse, (expected_out, expected_lse), rows = _run(q_lens, k_lens, heads, widths, causal, tuning, dtype, seed)
    _assert_matches(out[:rows], lse[:rows], expected_out[:rows], expected_lse[:rows])
    blind = torch.isneginf(expected_lse[:rows])
    assert torch.equal(out[:rows][blind].float(), torch.zeros_like(out[:rows][blind].float()))


@pytest.mark.parametrize("tuning", HOPPER_TUNINGS, ids=lambda t: t.kernel)
@pytest.mark.parametrize("widths", [(128, 64, 64), (64, 32, 128)], ids=lambda w: "x".join(map(str, w)))
@pytest.mark.parametrize("q_lens, k_lens, heads, causal", CASES[:4])
def test_sm90_kernels_take_v_narrower_or_wider_than_nope(q_lens, k_lens, heads, causal, widths, tuning):
    """d_v below d_nope (the rows leave through a slice of the warpgroup's Q half) and above it (too wide for
    the Q half: stored straight from the accumulator), against the oracle."""
    out, lse, (expected_out, expected_lse), rows = _run(q_lens, k_lens, heads, widths, causal, tuning, torch.bfloat16,
                                                        seed=sum(q_lens) + widths[2])
    _assert_matches(out[:rows], lse[:rows], expected_out[:rows], expected_lse[:rows])


@pytest.mark.parametrize("block_n, stages", [(128, 2), (64, 3)])
@pytest.mark.parametrize("widths", WIDTHS, ids=lambda w: "x".join(map(str, w)))
@pytest.mark.parametrize("q_lens, k_lens, heads, causal", CASES)
def test_persistent_kernel_on_two_programs_matches_float32_oracle(q_lens, k_lens, heads, causal, widths, block_n,
                                                                  stages, monkeypatch):
    """Two programs take every unit between them: the ring's stages and phases, Q's and the turns carry across
    units, units without rows or keys among them."""
    monkeypatch.setattr(hopper_prefill, "sm_count", lambda device: 2)
    tuning = PrefillTuning(128, block_n, 4, stages, kernel="hopper_persistent")
    out, lse, (expected_out, expected_lse), rows = _run(q_lens, k_lens, heads, widths, causal, tuning, torch.bfloat16,
                                                        seed=sum(q_lens) + heads)
    _assert_matches(out[:rows], lse[:rows], expected_out[:rows], expected_lse[:rows])


@pytest.mark.parametrize("programs", [2, 5, 132])
def test_persistent_launches_reuse_their_counter(programs, monkeypatch):
    """One launch object run twice on new values (units beyond the programs, skipped units among them: an
    empty segment, row blocks past the shorter segments): each run takes every unit, and the counter is back
    at zero after each."""
    monkeypatch.setattr(hopper_prefill, "sm_count", lambda device: programs)
    q_lens, k_lens, heads, causal = [700, 0, 300, 5], [900, 4, 300, 5], 12, True
    queries, keys = _segments(q_lens, DEVICE), _segments(k_lens, DEVICE)
    out = torch.empty(sum(q_lens), heads, 128, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=DEVICE)
    launch = None
    for seed in (11, 12):
        q, k_nope, k_pe, v = _kernel_inputs(q_lens, k_lens, heads, 128, 64, 128, torch.bfloat16, seed=seed,
                                            device=DEVICE)
        if launch is None:
            launch = plan_attention(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, out, lse,
                                    max_q_len=queries.max_len, causal=causal, merge=False,
                                    tuning=PrefillTuning(128, 128, 4, 2, kernel="hopper_persistent"))
            assert launch.persistent and launch.grid[0] == min(programs, launch.schedule[0])
            assert launch.schedule[0] > launch.grid[0]
        scale = 192**-0.5
        launch(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, out, lse, scale * triton_prefill.LOG2E)
        assert launch.taken.item() == 0
        want_out, want_lse = _oracle_pass(q.float(), k_nope.float(), k_pe.float(), v.float(), queries, keys,
                                          causal=causal, softmax_scale=scale)
        rows = out.shape[0]  # q carries NaN padding rows past the segments (never read)
        _assert_matches(out, lse, want_out[:rows], want_lse[:rows])


def test_prepared_prefill_runs_the_persistent_kernel_pass_after_pass(monkeypatch):
    """A prepared prefill keeps its persistent launches (and their counters) across calls; with prefix chunks
    merged in, each call runs several of them. Every call equals the unprepared one exactly (a unit's result
    does not depend on the program that takes it) and leaves every counter at zero."""
    monkeypatch.setattr(triton_prefill, "HOPPER_TUNING", PrefillTuning(128, 128, 4, 2, kernel="hopper_persistent"))
    monkeypatch.setattr(hopper_prefill, "sm_count", lambda device: 3)
    launches = []
    plan_launch = hopper_prefill.plan_launch

    def recorded(*args, **kwargs):
        launches.append(plan_launch(*args, **kwargs))
        return launches[-1]

    monkeypatch.setattr(hopper_prefill, "plan_launch", recorded)
    problem = Problem([300, 0, 40], [200, 130, 9], heads=5, page_size=16, d_nope=64, d_v=64, rope_dim=32, seed=4,
                      device=DEVICE)
    meta = problem.plan(prefix_chunk_tokens=128)

    def prefill(**kwargs):
        return mlakit.mla_prefill(problem.q, problem.batch.kv_cache, problem.weight, meta, softmax_scale=problem.scale,
                                  backend="triton", **kwargs)

    checked = prefill()
    results = [prefill(check_inputs=False) for _ in range(3)]
    assert len(meta.calls) == 1
    assert launches and all(launch.persistent for launch in launches)
    assert all(launch.taken.item() == 0 for launch in launches)
    for out, lse in results:
        assert torch.equal(out, checked[0]) and torch.equal(lse, checked[1])
    _assert_matches(*results[-1], *problem.latent_form())


@pytest.mark.parametrize("programs", [None, 2], ids=["every-sm", "two-programs"])
@pytest.mark.parametrize("tuning", HOPPER_TUNINGS, ids=lambda t: t.kernel)
@pytest.mark.parametrize("causal_first", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32-out", "bf16-out"])
def test_hopper_kernel_merges_a_second_key_set_into_the_first(out_dtype, causal_first, tuning, programs, monkeypatch):
    """Keys A, then keys B merged in (no mask), equals the portable kernel doing the same; rows of a
    segment without B keys stay exactly as they were. A 16-bit running output takes the staged row-piece
    store in the merging epilogue too."""
    q_lens, a_lens, b_lens = [190, 4, 70], [190, 300, 70], [260, 0, 3]
    heads, d_nope, d_rope, d_v = 3, 128, 64, 128
    q, a_nope, a_pe, a_v = _kernel_inputs(q_lens, a_lens, heads, d_nope, d_rope, d_v, torch.bfloat16, seed=5,
                                          device=DEVICE)
    _, b_nope, b_pe, b_v = _kernel_inputs(q_lens, b_lens, heads, d_nope, d_rope, d_v, torch.bfloat16, seed=6,
                                          device=DEVICE)
    queries, a_keys, b_keys = _segments(q_lens, DEVICE), _segments(a_lens, DEVICE), _segments(b_lens, DEVICE)
    if programs is not None:
        monkeypatch.setattr(hopper_prefill, "sm_count", lambda device: programs)
    results = []
    for tuning in (tuning, TUNINGS[-1]):
        out = torch.empty(q.shape[0], heads, d_v, dtype=out_dtype, device=DEVICE)
        lse = torch.empty(out.shape[:2], dtype=torch.float32, device=DEVICE)
        kwargs = dict(max_q_len=queries.max_len, softmax_scale=0.1, out=out, lse=lse, tuning=tuning)
        triton_mha_prefill(q, a_nope, a_pe, a_v, queries.cu_seqlens, a_keys.cu_seqlens, causal=causal_first, **kwargs)
        before = out.clone()
        triton_mha_prefill(q, b_nope, b_pe, b_v, queries.cu_seqlens, b_keys.cu_seqlens, causal=False, merge=True,
                           **kwargs)
        untouched = slice(q_lens[0], q_lens[0] + q_lens[1])
        assert torch.equal(out[untouched], before[untouched])
        results.append((out[:sum(q_lens)], lse[:sum(q_lens)]))
    (out, lse), (want_out, want_lse) = results
    _assert_matches(out, lse, want_out, want_lse)


def test_hopper_tuning_is_refused_where_the_kernel_cannot_run():
    q, k_nope, k_pe, v = _kernel_inputs([8], [8], 2, 24, 8, 20, torch.bfloat16, seed=1, device=DEVICE)
    cu = _segments([8], DEVICE).cu_seqlens
    with pytest.raises(MLAInputError, match="tuning: the hopper kernel needs an SM90 GPU.*widths 24, 8, 20"):
        triton_mha_prefill(q, k_nope, k_pe, v, cu, cu, max_q_len=8, causal=True, softmax_scale=0.2, tuning=TUNINGS[0])
    q, k_nope, k_pe, v = _kernel_inputs([8], [8], 2, 128, 64, 128, torch.bfloat16, seed=1, device=DEVICE)
    with pytest.raises(MLAInputError, match="block_n, stages: expected block_n 64 or 128 .* got block_n 128, stages 3"):
        triton_mha_prefill(q, k_nope, k_pe, v, cu, cu, max_q_len=8, causal=True, softmax_scale=0.2,
                           tuning=PrefillTuning(128, 128, 4, 3, kernel="hopper"))


@pytest.mark.parametrize("max_q_len, prefix, max_k_len, causal, block_n",
                         [(SHORT_PROMPT_TOKENS, 0, None, True, 64), (SHORT_PROMPT_TOKENS + 1, 0, None, True, 128),
                          (SHORT_PROMPT_TOKENS, 0, None, False, 128), (64, 512, None, True, 128),
                          (64, 512, 576, True, 128), (64, 64, 128, True, 64)])
def test_short_causal_passes_take_64_key_tiles(max_q_len, prefix, max_k_len, causal, block_n, monkeypatch):
    """Without a tuning, a causal pass whose segments have at most SHORT_PROMPT_TOKENS keys runs the persistent
    kernel with 64-key tiles (SHORT_HOPPER_TUNING); longer ones (a short prompt over a long prefix included: by
    `max_k_len`, or without it by the key rows) and non-causal passes the default's 128-key tiles. (On one SM, so
    that these few units stay on the persistent kernel.)"""
    monkeypatch.setattr(hopper_prefill, "sm_count", lambda device: 1)
    q, k_nope, k_pe, v = _kernel_inputs([max_q_len], [max_q_len + prefix], 2, 128, 64, 128, torch.bfloat16, seed=4,
                                        device=DEVICE)
    out = torch.empty(max_q_len, 2, 128, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=DEVICE)
    launch = plan_attention(q, k_nope, k_pe, v, _segments([max_q_len], DEVICE).cu_seqlens,
                            _segments([max_q_len + prefix], DEVICE).cu_seqlens, out, lse, max_q_len=max_q_len,
                            causal=causal, merge=False, max_k_len=max_k_len)
    assert launch.persistent and launch.constants["BLOCK_N"] == block_n
    assert _tuning_for(None, q, k_nope, k_pe, v, short=True) == SHORT_HOPPER_TUNING


@pytest.mark.parametrize("sms, persistent", [(20, False), (19, True)])
def test_passes_of_at_most_half_as_many_units_as_sms_take_one_program_per_unit(sms, persistent, monkeypatch):
    """Without a tuning, a pass of 2 heads x 5 row blocks (10 units) runs the one-program-per-row-block kernel with
    the persistent default's tiles where the GPU has at least twice as many SMs, else the persistent kernel; both
    equal the oracle. A caller's persistent tuning stays persistent."""
    monkeypatch.setattr(hopper_prefill, "sm_count", lambda device: sms)
    q_lens = k_lens = [600]
    q, k_nope, k_pe, v = _kernel_inputs(q_lens, k_lens, 2, 128, 64, 128, torch.bfloat16, seed=9, device=DEVICE)
    queries, keys = _segments(q_lens, DEVICE), _segments(k_lens, DEVICE)
    out = torch.empty(q.shape[0], 2, 128, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device=DEVICE)
    launch = plan_attention(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, out, lse, max_q_len=600,
                            causal=True, merge=False)
    assert launch.persistent == persistent and launch.constants["BLOCK_N"] == HOPPER_TUNING.block_n
    chosen = plan_attention(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, out, lse, max_q_len=600,
                            causal=True, merge=False, tuning=HOPPER_TUNING)
    assert chosen.persistent  # a caller's tuning is run as given
    got_out, got_lse = triton_mha_prefill(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=600,
                                          causal=True, softmax_scale=0.1)
    want_out, want_lse = _oracle_pass(q.float(), k_nope.float(), k_pe.float(), v.float(), queries, keys, causal=True,
                                      softmax_scale=0.1)
    _assert_matches(got_out[:600], got_lse[:600], want_out[:600], want_lse[:600])


def test_kept_launches_are_one_a_stream_and_none_under_capture():
    """`triton_mha_prefill` keeps one launch per layout and stream (16 heads x 8 row blocks: the persistent kernel):
    another stream gets its own, with its own unit counter, and a call under CUDA-graph capture keeps nothing; the
    captured call replays to the eager result exactly (a unit's result does not depend on the program taking it)."""
    q_lens = k_lens = [900]
    q, k_nope, k_pe, v = _kernel_inputs(q_lens, k_lens, 16, 128, 64, 128, torch.bfloat16, seed=12, device=DEVICE)
    queries, keys = _segments(q_lens, DEVICE), _segments(k_lens, DEVICE)

    def attend():
        return triton_mha_prefill(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=900, causal=True,
                                  softmax_scale=0.1)

    want_out, want_lse = attend()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attend()
    torch.cuda.current_stream().wait_stream(side)
    launches = list(triton_prefill._PLANS.values())
    assert len(launches) == 2 and all(launch.persistent for launch in launches)
    assert launches[0].taken.data_ptr() != launches[1].taken.data_ptr()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_out, captured_lse = attend()
    assert len(triton_prefill._PLANS) == 2
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured_out[:900], want_out[:900]) and torch.equal(captured_lse[:900], want_lse[:900])
    assert all(launch.taken.item() == 0 for launch in launches)


def test_calls_without_a_tuning_take_the_hopper_kernel_where_it_runs():
    """The Hopper kernel is the SM90 default; operands it cannot take (odd widths, q at an address TMA
    cannot read) fall back to the portable kernel, with the same result as the oracle."""
    supported = _kernel_inputs([40], [40], 2, 128, 64, 128, torch.bfloat16, seed=2, device=DEVICE)
    assert _tuning_for(None, *supported) == HOPPER_TUNING
    portable = default_prefill_tuning(torch.device(DEVICE))
    for widths, misaligned in (((24, 8, 20), False), ((128, 64, 128), True)):
        q, k_nope, k_pe, v = _kernel_inputs([40, 7], [60, 7], 3, *widths, torch.bfloat16, seed=3, device=DEVICE)
        if misaligned:  # q one element past a 16-byte boundary
            q = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEVICE)[1:].view(q.shape).copy_(q)
        assert _tuning_for(None, q, k_nope, k_pe, v) == portable
        queries, keys = _segments([40, 7], DEVICE), _segments([60, 7], DEVICE)
        scale = (widths[0] + widths[1]) ** -0.5
        out, lse = triton_mha_prefill(q, k_nope, k_pe, v, queries.cu_seqlens, keys.cu_seqlens, max_q_len=40,
                                      causal=True, softmax_scale=scale)
        want_out, want_lse = _oracle_pass(q.float(), k_nope.float(), k_pe.float(), v.float(), queries, keys,
                                          causal=True, softmax_scale=scale)
        _assert_matches(out[:47], lse[:47], want_out[:47], want_lse[:47])
