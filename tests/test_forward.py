"""A whole step through `mla_forward`: mixed decode / latent-extend / MHA-prefill parts, in
random token order, against the latent-form oracle over the whole batch."""

import dataclasses
import itertools
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlakit.attention.functional import (backend_for, mla_decode, mla_decode_metadata, mla_extend,
                                        mla_extend_metadata)
from mlakit.errors import MLAInputError
from mlakit.serving.forward import mla_forward
from mlakit.reference import reference_extend
from mlakit.serving.step import AttentionStep, draft_decode_steps
from paged_inputs import make_paged_batch, relative_error

HEADS, RANK, ROPE, NOPE, V_DIM = 3, 32, 16, 16, 24


def _mixed_step(new_tokens, cache_lens, page_size, device, seed, kv_dtype="bf16", scale_layout="tensor", rank=RANK,
                rope=ROPE, **policy):
    batch = make_paged_batch(list(cache_lens), heads=HEADS, page_size=page_size, kv_lora_rank=rank, rope_dim=rope,
                             kv_dtype=kv_dtype, scale_layout=scale_layout, seed=seed, device=device)
    table, page = batch.block_table, page_size
    host_table = table.cpu()
    slots = [int(host_table[b, t // page]) * page + t % page
             for b, (n, total) in enumerate(zip(new_tokens, cache_lens)) for t in range(total - n, total)]
    step = AttentionStep(tuple(new_tokens), tuple(cache_lens), table, torch.tensor(slots, device=device),
                         page_size=page_size, **policy)
    return batch, step


def _latent_oracle(q_nope, q_pe, batch, step, kv_b_weight, scale):
    per_head = kv_b_weight.float().view(HEADS, NOPE + V_DIM, RANK)
    q_latent = torch.cat([torch.einsum("thd,hdr->thr", q_nope.float(), per_head[:, :NOPE]), q_pe.float()], dim=-1)
    cu = torch.tensor([0, *torch.tensor(step.new_tokens).cumsum(0).tolist()], dtype=torch.int32, device=q_nope.device)
    out, _ = reference_extend(q_latent, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu,
                              kv_lora_rank=RANK, softmax_scale=scale, kv_scale=batch.kv_scale)
    return torch.einsum("thr,hvr->thv", out, per_head[:, NOPE:])


@pytest.mark.parametrize("kv_dtype, scale_layout", [("bf16", "tensor"), ("fp16", "tensor"), ("fp8_e4m3", "group")])
@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_step_equals_the_latent_oracle(kernel_device, kv_dtype, scale_layout, seed):
    gen = torch.Generator().manual_seed(seed)
    # decode (1 new token after a prefix), short extends, long prefills with and without a prefix, an idle sequence
    kinds = [(1, 40), (1, 9), (20, 20), (3, 11), (0, 7), (25, 61), (1, 1 + 16), (5, 5)]
    order = torch.randperm(len(kinds), generator=gen).tolist()
    new_tokens = [kinds[i][0] for i in order]
    cache_lens = [kinds[i][1] for i in order]
    batch, step = _mixed_step(new_tokens, cache_lens, 16, kernel_device, seed, kv_dtype, scale_layout,
                              prefix_chunk_tokens=13)
    assert {p.kind for p in step.parts} == {"decode", "latent_extend", "mha_prefill"}
    tokens = step.num_tokens
    q_nope = torch.randn(tokens, HEADS, NOPE, generator=gen).to(kernel_device)
    q_pe = torch.randn(tokens, HEADS, ROPE, generator=gen).to(kernel_device)
    kv_b_weight = (torch.randn(HEADS * (NOPE + V_DIM), RANK, generator=gen) / RANK**0.5).to(kernel_device, torch.bfloat16)
    # The registry offers triton on CUDA only; seed 1 lets "auto" pick (the decode's metadata then is its pick's).
    backend = "auto" if seed else "triton" if kernel_device == "cuda" else "reference"
    out = mla_forward(q_nope.bfloat16(), q_pe.bfloat16(), batch.kv_cache, batch.kv_scale, kv_b_weight, step,
                      softmax_scale=batch.softmax_scale, decode_backend=backend, prefill_backend=backend)
    expected = _latent_oracle(q_nope.bfloat16(), q_pe.bfloat16(), batch, step, kv_b_weight, batch.softmax_scale)
    assert relative_error(out, expected) < (3e-2 if kv_dtype == "fp8_e4m3" else 1e-2)


def test_speculative_verify_steps_go_to_decode_when_uniform_and_to_extend_when_uneven():
    table = torch.arange(8, dtype=torch.int32).view(4, 2)
    uniform = AttentionStep((4, 4, 4, 4), (9, 12, 30, 5), table, torch.zeros(16, dtype=torch.int64), page_size=16)
    assert [(p.kind, p.q_len, p.token_rows) for p in uniform.parts] == [("decode", 4, None)]
    uneven = AttentionStep((4, 2, 4, 1), (9, 12, 30, 5), table, torch.zeros(11, dtype=torch.int64), page_size=16,
                           decode_q_len=4)
    kinds = {p.kind: p.sequences for p in uneven.parts}
    assert kinds == {"decode": (0, 2), "latent_extend": (1, 3)}
    assert uneven.parts[0].token_rows.tolist() == [0, 1, 2, 3, 6, 7, 8, 9]
    assert uneven.parts[1].token_rows.tolist() == [4, 5, 10]
    # Each part knows its cached tokens from the host's lengths, and its decode metadata is built with them and the
    # page-size hint it is given.
    assert [p.kv_tokens for p in uneven.parts] == [9 + 30, 12 + 5]
    with mock.patch("mlakit.serving.step.mla_decode_metadata") as build:
        uniform.parts[0].decode_metadata("triton", 8, "bf16", 16)
    assert build.call_args.kwargs["kv_tokens_hint"] == 9 + 12 + 30 + 5
    assert build.call_args.kwargs["page_size"] == 16


@pytest.mark.parametrize("kv_dtype, scale_layout, rank, rope, hint", [
    ("fp8_e4m3", "tensor", 512, 64, 64), ("fp8_e4m3", "group", 512, 64, None), ("bf16", "tensor", RANK, ROPE, None),
])
@pytest.mark.parametrize("decode_backend", ["reference", "auto"])
@pytest.mark.parametrize("kind, new_tokens", [("decode", (1, 1)), ("extend", (3, 2))])
def test_step_metadata_takes_the_page_size_hint_of_the_layers_cache(kv_dtype, scale_layout, rank, rope, hint,
                                                                  decode_backend, kind, new_tokens):
    """A forward plans its decode and its latent extends with `decode_page_size_hint` of the cache it is given (one
    rule with the drop-ins and warm-up), on pages of 64 here: the page size over DeepSeek-width fp8 with one scale;
    None over per-group scales and over a latent narrower than the persistent kernel's two 64-column chunks. Under
    "auto" too: the metadata is the backend's the registry picks (the reference here, on the CPU), built once for
    every layer; a decode's is told the step's cached tokens (`kv_tokens_hint`), an extend's none (the variants
    `warm_up` compiles for extends)."""
    batch, step = _mixed_step(new_tokens, (9, 20), 64, "cpu", 0, kv_dtype, scale_layout, rank, rope)
    assert [p.kind for p in step.parts] == ["decode" if kind == "decode" else "latent_extend"]
    gen = torch.Generator().manual_seed(0)
    tokens = sum(new_tokens)
    q_nope = torch.randn(tokens, HEADS, NOPE, generator=gen).bfloat16()
    q_pe = torch.randn(tokens, HEADS, rope, generator=gen).bfloat16()
    kv_b_weight = torch.randn(HEADS * (NOPE + V_DIM), rank, generator=gen).bfloat16()
    builder = mla_decode_metadata if kind == "decode" else mla_extend_metadata
    attend = mla_decode if kind == "decode" else mla_extend
    built = []
    with (mock.patch(f"mlakit.serving.step.{builder.__name__}",
                     side_effect=lambda *args, **kwargs: built.append(builder(*args, **kwargs)) or built[-1]) as build,
          mock.patch(f"mlakit.serving.forward.{attend.__name__}", wraps=attend) as call,
          mock.patch("mlakit.serving.forward.backend_for", wraps=backend_for) as resolve):
        for _ in range(2):  # two layers
            mla_forward(q_nope, q_pe, batch.kv_cache, batch.kv_scale, kv_b_weight, step,
                        softmax_scale=batch.softmax_scale, decode_backend=decode_backend, prefill_backend="reference")
    assert [call.kwargs["page_size"] for call in build.call_args_list] == [hint]
    assert build.call_args.kwargs["backend"] == "reference"
    assert build.call_args.kwargs.get("kv_tokens_hint") == (9 + 20 if kind == "decode" else None)
    assert [c.kwargs["metadata"] for c in call.call_args_list] == built * 2, "each layer's call takes the one built"
    assert resolve.call_count == 1, "the backend is resolved once a step for a cache layout"


def test_prefill_form_policy_and_bad_steps():
    table = torch.zeros(2, 2, dtype=torch.int32)
    step = AttentionStep((20, 3), (20, 3), table, torch.zeros(23, dtype=torch.int64), page_size=16, prefill_form="mha")
    assert [p.kind for p in step.parts] == ["mha_prefill"]
    step = AttentionStep((20, 3), (20, 3), table, torch.zeros(23, dtype=torch.int64), page_size=16, prefill_form="latent")
    assert [p.kind for p in step.parts] == ["latent_extend"]
    with pytest.raises(MLAInputError, match="cache_lens\\[1\\]: 40 tokens do not fit the block table.s 2 pages of 16"):
        AttentionStep((1, 1), (3, 40), table, torch.zeros(2, dtype=torch.int64), page_size=16)
    with pytest.raises(MLAInputError, match="slots: expected shape \\[2\\]"):
        AttentionStep((1, 1), (3, 4), table, torch.zeros(3, dtype=torch.int64), page_size=16)
    with pytest.raises(MLAInputError, match="prefill_form"):
        AttentionStep((1, 1), (3, 4), table, torch.zeros(2, dtype=torch.int64), page_size=16, prefill_form="fast")


@pytest.mark.gpu
def test_step_metadata_and_a_mixed_forward_never_wait_for_the_gpu():
    """Building the parts (prefill chunks included) and running every part with check_inputs=False
    under torch's sync debug mode set to error: no host-device synchronisation anywhere."""
    gen = torch.Generator().manual_seed(4)
    new_tokens, cache_lens = [1, 40, 3, 1, 0, 30], [50, 90, 11, 2, 6, 30]
    batch, _ = _mixed_step(new_tokens, cache_lens, 16, "cuda", 4)
    host_table = batch.block_table.cpu()
    slots = torch.tensor([int(host_table[b, t // 16]) * 16 + t % 16
                          for b, (n, total) in enumerate(zip(new_tokens, cache_lens)) for t in range(total - n, total)])
    slots = slots.cuda()
    tokens = sum(new_tokens)
    q_nope = torch.randn(tokens, HEADS, NOPE, generator=gen).cuda().bfloat16()
    q_pe = torch.randn(tokens, HEADS, ROPE, generator=gen).cuda().bfloat16()
    kv_b_weight = (torch.randn(HEADS * (NOPE + V_DIM), RANK, generator=gen) / RANK**0.5).cuda().bfloat16()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step = AttentionStep(tuple(new_tokens), tuple(cache_lens), batch.block_table, slots, page_size=16,
                             prefix_chunk_tokens=16, heads=HEADS)
        assert {p.kind for p in step.parts} == {"decode", "latent_extend", "mha_prefill"}
        assert step.parts[-1].prefill.prefix_chunks, "the 90-token sequence's prefix must be chunked"
        out = mla_forward(q_nope, q_pe, batch.kv_cache, batch.kv_scale, kv_b_weight, step, softmax_scale=batch.softmax_scale,
                          decode_backend="triton", prefill_backend="triton", check_inputs=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = _latent_oracle(q_nope, q_pe, batch, step, kv_b_weight, batch.softmax_scale)
    assert relative_error(out, expected) < 1e-2


def test_speculative_modes_are_checked_when_the_step_is_made():
    table = torch.arange(8, dtype=torch.int32).view(4, 2)
    slots = torch.zeros(16, dtype=torch.int64)
    verify = AttentionStep((4, 4, 4, 4), (9, 12, 30, 5), table, slots, page_size=16, decode_q_len=4, spec_mode="target_verify")
    assert [p.kind for p in verify.parts] == ["decode"]
    uneven = AttentionStep((4, 2, 3, 4), (9, 12, 30, 5), table, slots[:13], page_size=16, decode_q_len=4, spec_mode="target_verify")
    assert {p.kind: p.sequences for p in uneven.parts} == {"decode": (0, 3), "latent_extend": (1, 2)}
    with pytest.raises(MLAInputError, match="target_verify with decode_q_len 4 \\(k \\+ 1\\) got 5 query tokens"):
        AttentionStep((5, 4, 4, 4), (9, 12, 30, 5), table, torch.zeros(17, dtype=torch.int64), page_size=16, decode_q_len=4,
                      spec_mode="target_verify")
    with pytest.raises(MLAInputError, match="sequence 3: a target_verify step needs a cached prefix"):
        AttentionStep((4, 4, 4, 4), (9, 12, 30, 4), table, slots, page_size=16, decode_q_len=4, spec_mode="target_verify")
    with pytest.raises(MLAInputError, match="draft_decode step adds at most 1 token"):
        AttentionStep((1, 2, 1, 1), (9, 12, 30, 5), table, slots[:5], page_size=16, spec_mode="draft_decode")
    with pytest.raises(MLAInputError, match="spec_mode: expected one of"):
        AttentionStep((1, 1, 1, 1), (9, 12, 30, 5), table, slots[:4], page_size=16, spec_mode="tree")


def test_draft_decode_steps_write_one_token_each_and_attend_like_the_oracle(kernel_device):
    gen = torch.Generator().manual_seed(9)
    cache_lens = (31, 0, 15, 16, 47)  # one idle sequence; 15 -> 16 and 47 -> 48 cross page boundaries
    batch, _ = _mixed_step([0] * 5, [n + 3 for n in cache_lens], 16, kernel_device, seed=9)
    steps = draft_decode_steps(cache_lens, batch.block_table, 16, num_steps=3, heads=HEADS)
    host_table = batch.block_table.cpu()
    kv_b_weight = (torch.randn(HEADS * (NOPE + V_DIM), RANK, generator=gen) / RANK**0.5).to(kernel_device, torch.bfloat16)
    backend = "triton" if kernel_device == "cuda" else "reference"
    for i, step in enumerate(steps):
        live = [b for b, n in enumerate(cache_lens) if n]
        assert step.spec_mode == "draft_decode" and step.new_tokens == tuple(1 if n else 0 for n in cache_lens)
        assert step.slots.tolist() == [int(host_table[b, (cache_lens[b] + i) // 16]) * 16 + (cache_lens[b] + i) % 16 for b in live]
        assert [p.kind for p in step.parts] == ["decode"]
        rows = torch.randn(len(live), RANK + ROPE, generator=gen).to(kernel_device)
        batch.kv_cache.view(-1, RANK + ROPE)[step.slots] = rows.to(batch.kv_cache.dtype)
        q_nope = torch.randn(len(live), HEADS, NOPE, generator=gen).to(kernel_device).bfloat16()
        q_pe = torch.randn(len(live), HEADS, ROPE, generator=gen).to(kernel_device).bfloat16()
        out = mla_forward(q_nope, q_pe, batch.kv_cache, None, kv_b_weight, step, softmax_scale=batch.softmax_scale,
                          decode_backend=backend, prefill_backend=backend)
        oracle_batch = dataclasses.replace(batch, cache_seqlens=step.cache_seqlens)
        expected = _latent_oracle(q_nope, q_pe, oracle_batch, step, kv_b_weight, batch.softmax_scale)
        assert relative_error(out, expected) < 1e-2


def test_review_regressions_in_step_metadata():
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    # equal long chunks of a chunked prefill are not a decode
    chunked = AttentionStep((40, 40), (80, 90), table, torch.zeros(80, dtype=torch.int64), page_size=32)
    assert [p.kind for p in chunked.parts] == ["mha_prefill"]
    # an idle sequence keeps its length through every draft step
    steps = draft_decode_steps((3, 0), table, page_size=32, num_steps=3)
    assert [s.cache_lens for s in steps] == [(4, 0), (5, 0), (6, 0)]


def test_forward_names_bad_queries_and_a_decode_backend_without_latent_extend():
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    step = AttentionStep((1, 2), (5, 2), table, torch.tensor([4, 8, 9]), page_size=8)
    args = (torch.randn(2, 8, 48), None, torch.randn(2 * (16 + 8), 32), step)
    with pytest.raises(MLAInputError, match="q_nope: expected \\[3 tokens"):
        mla_forward(torch.randn(2, 2, 16), torch.randn(2, 2, 16), *args, softmax_scale=0.2)
    with pytest.raises(MLAInputError, match="decode backend 'flashmla' has no latent-form extend kernel .* max_latent_extend_tokens=0"):
        mla_forward(torch.randn(3, 2, 16), torch.randn(3, 2, 16), *args, softmax_scale=0.2, decode_backend="flashmla")
    cache, weight = torch.randn(2, 8, 48, dtype=torch.bfloat16), torch.randn(2 * (16 + 8), 32, dtype=torch.bfloat16)
    with pytest.raises(MLAInputError, match=r"^kv_scale: expected None or a float32 tensor .*, got 1.0$"):
        mla_forward(torch.randn(3, 2, 16).bfloat16(), torch.randn(3, 2, 16).bfloat16(), cache, 1.0, weight, step,
                    softmax_scale=0.2)


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 30)), min_size=1, max_size=7),
    decode_q_len=st.one_of(st.none(), st.integers(1, 8)),
    form=st.sampled_from(["auto", "latent", "mha"]),
)
def test_step_parts_hold_every_token_once_in_packed_order(counts, decode_q_len, form):
    new_tokens = tuple(n for n, _ in counts)
    cache_lens = tuple(n + p for n, p in counts)
    table = torch.zeros(len(counts), 20, dtype=torch.int32)
    step = AttentionStep(new_tokens, cache_lens, table, torch.zeros(sum(new_tokens), dtype=torch.int64), page_size=4,
                         decode_q_len=decode_q_len, prefill_form=form)
    offsets = [0, *itertools.accumulate(new_tokens)]
    seen_sequences, seen_rows = [], []
    for part in step.parts:
        rows = list(range(step.num_tokens)) if part.token_rows is None else part.token_rows.tolist()
        assert rows == [r for b in part.sequences for r in range(offsets[b], offsets[b + 1])]
        assert part.cu_seqlens_q.tolist() == [0, *itertools.accumulate(part.new_tokens)]
        assert part.cache_seqlens.tolist() == [cache_lens[b] for b in part.sequences]
        if part.kind == "decode":
            assert all(new_tokens[b] == part.q_len and cache_lens[b] > new_tokens[b] for b in part.sequences)
        if part.kind == "mha_prefill":
            assert part.prefill is not None and part.prefill.queries.lens == part.new_tokens
        seen_sequences += part.sequences
        seen_rows += rows
    assert sorted(seen_sequences) == [b for b, n in enumerate(new_tokens) if n]
    assert sorted(seen_rows) == list(range(step.num_tokens))


@pytest.mark.parametrize("table, cache_shape, with_scale, pattern", [
    ([[0, 1], [-1, 3], [2, 3]], (4, 8, 48), False, r"block_table: expected page indices in \[0, 4\) .*got block_table\[1, 0\] = -1"),
    ([[0, 9], [1, 3], [2, 3]], (4, 8, 48), False, r"block_table: .*got block_table\[0, 1\] = 9"),
    ([[0, 1], [2, 3], [3, 2]], (4, 8, 48), True, r"kv_scale: expected None for a float32 cache"),
    ([[0, 1], [2, 3], [3, 2]], (8, 4, 48), False, r"kv_cache: expected \[num_pages, 8 \(the step's page size\), dim\]"),
])
def test_the_exact_float32_path_checks_the_cache_as_the_kernels_paths_do(table, cache_shape, with_scale, pattern):
    """A float32 cache runs on the torch oracles, which would wrap a negative page index to the last page: the step's
    pages, the cache's page size and the scale are checked as the bf16 path's calls check them."""
    generator = torch.Generator().manual_seed(3)
    step = AttentionStep((1, 3, 2), (9, 3, 12), torch.tensor(table, dtype=torch.int32), torch.arange(6), page_size=8)
    q_nope, q_pe = torch.randn(6, 2, 16, generator=generator), torch.randn(6, 2, 16, generator=generator)
    with pytest.raises(MLAInputError, match=pattern):
        mla_forward(q_nope, q_pe, torch.randn(cache_shape, generator=generator), torch.ones(1) if with_scale else None,
                    torch.randn(2 * 24, 32, generator=generator), step, softmax_scale=0.1)


@pytest.mark.parametrize("num_steps", [0, 1.5, None])
def test_draft_decode_steps_names_a_bad_step_count(num_steps):
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(MLAInputError, match=r"num_steps: expected an integer >= 1, got"):
        draft_decode_steps((3, 4), table, page_size=4, num_steps=num_steps)


@pytest.mark.parametrize("cache_lens", [None, "34", (3, 4.0), (3, -1), (3, True)])
def test_draft_decode_steps_names_bad_lengths(cache_lens):
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(MLAInputError, match=r"^cache_lens: expected a tuple of integers >= 0 \(host ints\), got"):
        draft_decode_steps(cache_lens, table, page_size=4, num_steps=2)
