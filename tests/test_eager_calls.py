"""Eager calls reuse what depends only on the inputs' layout (checks, backend choice, kernel launches, TMA
descriptors) and never what depends on where the tensors are or what they hold: a cache, q, page table,
lengths or output at a new address, or with new values, is read and written where it now is."""

import gc
import types
import weakref

import pytest
import torch
import triton
import triton.language as tl

import mlakit
from mlakit.attention.functional import mla_extend_metadata
from mlakit.errors import MLAInputError
from mlakit.kernels import hopper_common
from paged_inputs import assert_lse_close, make_paged_batch, relative_error


def _decode(batch, **kwargs):
    return mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                             softmax_scale=batch.softmax_scale, backend="triton", kv_scale=batch.kv_scale,
                             kv_lora_rank=batch.kv_lora_rank, **kwargs)


def _reference(batch):
    return mlakit.reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                   kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale,
                                   kv_scale=batch.kv_scale)


def _assert_matches_reference(batch, out, lse):
    ref_out, ref_lse = _reference(batch)
    assert relative_error(out, ref_out) < 1e-2
    assert_lse_close(lse, ref_lse, atol=1e-3)


def _batch(kernel_device, seed, lens=(70, 0, 33), **kwargs):
    options = dict(heads=5, q_len=2, page_size=16, seed=seed, device=kernel_device)
    options.update(kwargs)
    return make_paged_batch(list(lens), **options)


def test_one_metadata_serves_calls_whose_tensors_move_and_change(kernel_device):
    first = _batch(kernel_device, seed=1)
    metadata = mlakit.mla_decode_metadata(first.cache_seqlens, q_len=2, heads=5, backend="triton")
    _assert_matches_reference(first, *_decode(first, metadata=metadata, check_inputs=False))
    # Same layout, every tensor new (other addresses, other values): the call reads the new ones.
    second = _batch(kernel_device, seed=2)
    _assert_matches_reference(second, *_decode(second, metadata=metadata, check_inputs=False))
    # Values changed in place at the same addresses, lengths included (sequences grew into their last
    # pages' unused slots, now given values; the plan only balances the work).
    first.kv_cache.copy_(torch.nan_to_num(second.kv_cache, nan=0.5))
    first.q.copy_(second.q)
    first.block_table.copy_(second.block_table)
    first.cache_seqlens.copy_(torch.tensor([80, 0, 40], dtype=torch.int32))
    _assert_matches_reference(first, *_decode(first, metadata=metadata, check_inputs=False))


def test_a_prepared_call_serves_every_later_call_of_its_layout(kernel_device):
    batch = _batch(kernel_device, seed=11)
    metadata = mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=2, heads=5, backend="triton")
    flash_mla_cache = batch.kv_cache.unsqueeze(2)  # [pages, page_size, 1, dim]
    for round_ in range(3):
        got = mlakit.mla_decode(batch.q, flash_mla_cache, batch.block_table, batch.cache_seqlens, backend="triton",
                                kv_lora_rank=64, metadata=metadata, check_inputs=False, return_lse=False)
        assert got[1] is None
        batch.softmax_scale = batch.q.shape[-1] ** -0.5  # the default scale the call used
        _assert_matches_reference(batch, got[0], _reference(batch)[1])
        _assert_matches_reference(batch, *_decode(batch, metadata=metadata, check_inputs=False))
        batch.q.copy_(torch.randn_like(batch.q))
    assert len(metadata.calls) == 2  # one per layout (return_lse, kv_lora_rank and the cache view differ)
    batch.block_table[0, 0] = 10_000
    with pytest.raises(MLAInputError, match="^block_table: "):  # checked calls never take the prepared one
        _decode(batch, metadata=metadata)


def test_a_freed_cache_is_not_read_through_a_kept_launch(kernel_device):
    batch = _batch(kernel_device, seed=3)
    metadata = mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=2, heads=5, backend="triton")
    _decode(batch, metadata=metadata, check_inputs=False)
    for seed in (4, 5):  # the allocator may hand the freed addresses to the new tensors
        del batch
        gc.collect()
        batch = _batch(kernel_device, seed=seed)
        _assert_matches_reference(batch, *_decode(batch, metadata=metadata, check_inputs=False))


def test_out_and_lse_are_written_in_place(kernel_device):
    batch = _batch(kernel_device, seed=6)
    out = torch.full((3, 2, 5, 64), float("nan"), dtype=torch.bfloat16, device=kernel_device)
    lse = torch.full((3, 5, 2), float("nan"), dtype=torch.float32, device=kernel_device)
    got_out, got_lse = _decode(batch, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    _assert_matches_reference(batch, out, lse)


def test_out_of_the_wrong_layout_is_refused_by_name(kernel_device):
    batch = _batch(kernel_device, seed=7)
    device = batch.q.device
    bad = {
        "shape": torch.empty(3, 2, 5, 32, dtype=torch.bfloat16, device=device),
        "dtype": torch.empty(3, 2, 5, 64, dtype=torch.float16, device=device),
        "strides": torch.empty(3, 2, 64, 5, dtype=torch.bfloat16, device=device).transpose(2, 3),
        "unmergeable": torch.empty(3, 5, 2, 64, dtype=torch.bfloat16, device=device).transpose(1, 2),
    }
    for what, out in bad.items():
        with pytest.raises(MLAInputError, match="^out: "):
            _decode(batch, out=out)
    with pytest.raises(MLAInputError, match="^lse: "):
        _decode(batch, lse=torch.empty(3, 2, 5, device=device))


def test_a_reused_layout_still_checks_values_when_asked(kernel_device):
    batch = _batch(kernel_device, seed=8)
    _decode(batch)
    batch.block_table[0, 0] = 10_000
    with pytest.raises(MLAInputError, match="^block_table: "):
        _decode(batch)
    with pytest.raises(MLAInputError, match="^q: "):
        mlakit.mla_decode(batch.q.float(), batch.kv_cache, batch.block_table, batch.cache_seqlens, backend="triton",
                          kv_lora_rank=64, check_inputs=False)


def _extend_inputs(kernel_device, seed):
    batch = _batch(kernel_device, seed=seed, lens=(40, 9, 3), q_len=1)
    cu_seqlens_q = torch.tensor([0, 3, 4, 7], dtype=torch.int32, device=batch.q.device)
    q = torch.randn(7, 5, batch.q.shape[-1], dtype=torch.bfloat16, generator=torch.Generator().manual_seed(seed))
    return batch, q.to(batch.q.device), cu_seqlens_q


def _extend(batch, q, cu_seqlens_q, **kwargs):
    return mlakit.mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu_seqlens_q, max_q_len=3,
                             softmax_scale=batch.softmax_scale, backend="triton", kv_lora_rank=64, **kwargs)


def test_extend_with_metadata_matches_extend_without(kernel_device):
    batch, q, cu_seqlens_q = _extend_inputs(kernel_device, seed=9)
    metadata = mla_extend_metadata(batch.cache_seqlens, cu_seqlens_q, max_q_len=3, heads=5, backend="triton")
    expected_out, expected_lse = mlakit.reference_extend(
        q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu_seqlens_q, kv_lora_rank=64,
        softmax_scale=batch.softmax_scale)
    out = torch.empty(7, 5, 64, dtype=torch.bfloat16, device=q.device)
    prepared = {"metadata": metadata, "check_inputs": False, "out": out}
    for kwargs in ({}, {"metadata": metadata}, prepared, prepared):
        got_out, got_lse = _extend(batch, q, cu_seqlens_q, **kwargs)
        assert relative_error(got_out, expected_out) < 1e-2
        assert_lse_close(got_lse, expected_lse, atol=1e-3)
    assert got_out is out and len(metadata.calls) == 1


def test_extend_metadata_refuses_other_offsets(kernel_device):
    batch, q, cu_seqlens_q = _extend_inputs(kernel_device, seed=10)
    metadata = mla_extend_metadata(batch.cache_seqlens, cu_seqlens_q, max_q_len=3, heads=5, backend="triton")
    with pytest.raises(MLAInputError, match="^cu_seqlens_q: expected the tensor"):
        _extend(batch, q, cu_seqlens_q.clone(), metadata=metadata, check_inputs=False)
    cu_seqlens_q.copy_(torch.tensor([0, 2, 4, 7], dtype=torch.int32))
    with pytest.raises(MLAInputError, match="^cu_seqlens_q: expected the offsets"):
        _extend(batch, q, cu_seqlens_q, metadata=metadata)
    with pytest.raises(MLAInputError, match="^metadata: built for backend 'triton', max_q_len 3"):
        mlakit.mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu_seqlens_q, max_q_len=4,
                          backend="triton", kv_lora_rank=64, metadata=metadata)


def test_row_descriptors_are_kept_by_address_and_hold_no_tensor():
    pages = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    boxes = ((64, 64), (64, 64))
    first = hopper_common.row_descriptors(pages, boxes)
    assert hopper_common.row_descriptors(pages, boxes) is first
    assert first[0].base.data_ptr() == pages.data_ptr() and first[0].shape == [256, 576]
    other = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    assert hopper_common.row_descriptors(other, boxes)[0].base.data_ptr() == other.data_ptr()
    assert hopper_common.row_descriptors(pages[:2], boxes)[0].shape == [128, 576]
    alive = weakref.ref(pages)
    del pages, first
    gc.collect()
    assert alive() is None


def test_a_descriptor_filling_two_arguments_is_expanded_once_for_each(monkeypatch):
    """The decode kernels' latent and rope boxes are both 64 x 64 over the cache rows (one descriptor, two
    kernel arguments with their own metadata): each argument's expansion is kept, neither evicts the other."""
    from triton.backends.nvidia import driver as nvidia_driver

    from mlakit.kernels import launch

    expansions = []
    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg",
                        lambda descriptor, meta: expansions.append(meta["argument"]) or [meta["argument"]])
    latent, rope = hopper_common.row_descriptors(torch.zeros(2, 64, 576, dtype=torch.bfloat16), ((64, 64), (64, 64)))
    assert latent is rope
    metas = ({"argument": "latent"}, {"argument": "rope"})
    for _ in range(3):
        assert [launch._expanded(latent, meta) for meta in metas] == [["latent"], ["rope"]]
    assert expansions == ["latent", "rope"]
    assert launch._expanded(latent, {"argument": "latent"}) == ["latent"]  # another kernel's metadata: its own
    assert expansions == ["latent", "rope", "latent"]


def test_kernels_without_descriptors_launch_through_the_c_entry(monkeypatch):
    """On Triton 3.6 the raw launch serves kernels without descriptor arguments too (the launcher's C function
    itself), and never one that needs scratch memory (the Python launcher allocates it)."""
    from mlakit.kernels import launch

    class Runner:
        launch = staticmethod(print)  # a C function, as Triton's launcher module's entry is
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid = launch_pdl = False

    class Compiled:
        run = Runner()

    monkeypatch.setattr(launch.triton, "__version__", "3.6.0")
    raw = launch._raw_launch(Compiled())
    assert raw is not None and raw.launch is print and raw.descriptors == ()
    Runner.global_scratch_size = 64
    assert launch._raw_launch(Compiled()) is None
    Runner.global_scratch_size = 0
    monkeypatch.setattr(launch.triton, "__version__", "3.7.1")
    assert launch._raw_launch(Compiled()) is None


def test_a_kept_raw_launch_passes_the_arguments_as_given(monkeypatch):
    """A kernel without descriptor arguments, launched through its kept C entry: grid, stream, the compiled
    function and metadata, then this call's arguments unchanged and the first call's trailing constants."""
    from mlakit.kernels import launch

    calls = []
    compiled = type("Compiled", (), {"function": "fn", "packed_metadata": "meta"})()
    raw = launch._RawLaunch(lambda *args: calls.append(args), (), False, False)
    cached = launch.CachedLaunch(_add_one)
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "VERIFY", False)
    active = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: "stream")
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(active=active))
    cached._compiled[0, "key"] = (compiled, (64,), raw)
    cached("key", (3, 1, 1), ("x", 7), {"BLOCK": 64})
    assert calls == [(3, 1, 1, "stream", "fn", False, False, None, None, "meta", None, None, None, "x", 7, 64)]


@pytest.mark.parametrize("interpreted", [True, False])
def test_every_launch_asks_for_fused_multiply_adds(monkeypatch, interpreted):
    """Fp fusion is named at each compile, not left to Triton's default (3.10 turns it off): the interpreted call, the
    first compile and the check of a kept launch against Triton's choice; a launch site's constants go alongside."""
    from mlakit.kernels import launch

    seen = []
    compiled = types.SimpleNamespace(function="fn", packed_metadata="meta", run=lambda *args: seen.append("run"))

    class Kernel:
        fn = _add_one.fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append(kwargs) or compiled

        def warmup(self, *args, grid, **kwargs):
            seen.append(kwargs)
            return compiled

    monkeypatch.setattr(launch, "INTERPRET", interpreted)
    monkeypatch.setattr(launch, "VERIFY", True)
    monkeypatch.setattr(launch, "_raw_launch", lambda compiled: None)
    active = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: "stream")
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(active=active))
    cached = launch.CachedLaunch(Kernel())
    for _ in range(2):
        cached("key", (1, 1, 1), ("x", 7), {"BLOCK": 64})
    named = {"enable_fp_fusion": True, "BLOCK": 64}
    assert seen == ([named, named] if interpreted else [named, named, "run"])


@triton.jit
def _add_one(X, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(X + offsets, tl.load(X + offsets, mask=offsets < n) + 1, mask=offsets < n)


@pytest.mark.gpu
def test_a_launch_key_that_misses_a_specialization_is_caught():
    from mlakit.kernels.launch import CachedLaunch, StaleLaunchError

    launch = CachedLaunch(_add_one)
    x = torch.zeros(64, device="cuda")
    launch("one key", (1, 1, 1), (x, 64), {"BLOCK": 64})
    launch("one key", (1, 1, 1), (x, 64), {"BLOCK": 64})
    assert x.tolist() == [2.0] * 64
    with pytest.raises(StaleLaunchError, match="_add_one: launch key 'one key'"):
        launch("one key", (1, 1, 1), (x[1:], 63), {"BLOCK": 64})  # a misaligned pointer and another length specialize anew
