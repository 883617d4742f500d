"""The portable Triton decode kernel against the float64 oracle (CPU interpreter, small shapes)."""

import dataclasses
import functools

import pytest
import torch

from mlakit.kernels import triton_decode
from mlakit.kernels.decode_split_plan import balanced_plan, fixed_split_plan, split_geometry
from mlakit.kernels.triton_decode import (
    CombineTiling,
    DecodeTuning,
    default_tuning,
    plan_decode,
    triton_mla_decode,
    triton_mla_extend,
)
from mlakit.reference import reference_extend
from paged_inputs import assert_lse_close, make_paged_batch, naive_decode, relative_error

CASES = [
    # seq_lens, heads, q_len, page_size, kv_lora_rank, rope_dim, kv_dtype, scale_layout, num_sms
    ([5, 0, 37, 16], 3, 1, 16, 64, 16, "bf16", "tensor", 4),
    ([100, 3], 5, 2, 8, 64, 16, "fp16", "tensor", 16),
    ([70, 1], 4, 3, 1, 64, 16, "fp8_e4m3", "group", 8),
    ([64, 129], 16, 1, 64, 64, 16, "fp8_e4m3", "tensor", 2),
    ([0, 0], 1, 1, 32, 64, 16, "bf16", "tensor", 4),
    ([200], 20, 1, 128, 64, 16, "bf16", "tensor", 32),
    ([9, 40, 2], 2, 8, 4, 64, 16, "bf16", "tensor", 8),
    ([33, 17], 5, 1, 16, 256, 32, "bf16", "tensor", 4),
    ([60], 40, 1, 32, 256, 32, "fp16", "tensor", 4),
    ([2000, 7], 2, 1, 16, 64, 16, "bf16", "tensor", 512),  # ~31 splits: the combine loops over split chunks
]


@pytest.mark.parametrize("seq_lens, heads, q_len, page_size, kv_lora_rank, rope_dim, kv_dtype, scale_layout, num_sms", CASES)
def test_triton_decode_matches_oracle(
    seq_lens, heads, q_len, page_size, kv_lora_rank, rope_dim, kv_dtype, scale_layout, num_sms, kernel_device
):
    batch = make_paged_batch(
        seq_lens, heads=heads, q_len=q_len, page_size=page_size, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim,
        kv_dtype=kv_dtype, scale_layout=scale_layout, q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16,
        seed=sum(seq_lens) + heads, device=kernel_device,
    )
    out, lse = triton_mla_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        kv_lora_rank=kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, num_sms=num_sms,
    )
    expected_out, expected_lse = naive_decode(batch)
    assert out.dtype == batch.q.dtype
    assert torch.isfinite(out.float()).all(), "NaN from unused pages or slots leaked into the output"
    assert relative_error(out, expected_out) < (3e-2 if kv_dtype == "fp8_e4m3" else 1e-2)
    assert_lse_close(lse, expected_lse, atol=3e-2 if kv_dtype == "fp8_e4m3" else 1e-3)


@pytest.mark.parametrize("tiling", [CombineTiling(16, 1, 32), CombineTiling(1, 4, 64), CombineTiling(4, 2, 64)])
def test_every_combine_tiling_merges_splits_exactly(tiling, kernel_device, monkeypatch):
    batch = make_paged_batch([900, 0, 1, 333], heads=3, q_len=2, page_size=16, kv_lora_rank=64, rope_dim=16,
                             seed=7, device=kernel_device)
    monkeypatch.setattr(triton_decode, "combine_tiling", lambda *args: tiling)
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=64,
                                 softmax_scale=batch.softmax_scale, kv_scale=None, num_sms=64)
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 1e-2
    assert_lse_close(lse, expected_lse, atol=1e-3)


@pytest.mark.parametrize("max_splits", [5, 40])  # both combine tilings
def test_combine_merges_keyless_splits_and_ignores_unused_ones(max_splits, kernel_device):
    heads, q_len, kv_lora_rank, batch = 3, 2, 64, 4
    rows, padded_rows = heads * q_len, 16
    gen = torch.Generator().manual_seed(max_splits)
    num_splits = torch.tensor([max_splits, max_splits - 3, 1, 2], dtype=torch.int32)
    part_out = torch.randn(batch, max_splits, padded_rows, kv_lora_rank, generator=gen)
    part_lse = torch.randn(batch, max_splits, padded_rows, generator=gen) * 5
    part_lse[0, ::3, 1] = float("-inf")  # splits that saw no key of a row ...
    part_lse[0, :, 2] = float("-inf")  # ... every split of a row (lse -inf, output 0) ...
    part_lse[3] = float("-inf")  # ... and of a whole sequence
    part_out[part_lse == float("-inf")] = 0.0
    for b in range(batch):  # partials past a sequence's splits hold garbage the combine must not read
        part_lse[b, num_splits[b]:] = float("nan")
        part_out[b, num_splits[b]:] = float("nan")
    # The sequences' runs of slots in another order than the batch's: the combine finds them by FIRST_SLOTS.
    block_of = torch.tensor([2, 0, 3, 1])
    first_slots = (block_of * max_splits).to(torch.int32)
    slot_out = torch.empty(batch * max_splits, padded_rows, kv_lora_rank)
    slot_lse = torch.empty(batch * max_splits, padded_rows)
    for b in range(batch):
        slot_out[first_slots[b]:first_slots[b] + max_splits] = part_out[b]
        slot_lse[first_slots[b]:first_slots[b] + max_splits] = part_lse[b]
    out = torch.full((batch * q_len, heads, kv_lora_rank), 7.0)
    lse = torch.full((batch, heads, q_len), 7.0)
    slot_out, slot_lse, out, lse = (t.to(kernel_device) for t in (slot_out, slot_lse, out, lse))
    tiling = triton_decode.combine_tiling(max_splits, kv_lora_rank)
    cu_seqlens_q = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=kernel_device)
    triton_decode._mla_decode_combine_kernel[(batch, -(-rows // tiling.rows), -(-kv_lora_rank // tiling.columns))](
        slot_out, slot_lse, num_splits.to(kernel_device), first_slots.to(kernel_device), cu_seqlens_q, out, lse,
        (slot_out.stride(0), slot_out.stride(1), slot_lse.stride(0)),
        (out.stride(0), out.stride(1)), (0, lse.stride(0), lse.stride(2), lse.stride(1)),
        HEADS=heads, KV_LORA_RANK=kv_lora_rank, BLOCK_SPLITS=tiling.splits, BLOCK_ROWS=tiling.rows,
        BLOCK_C=tiling.columns,
    )
    out, lse = out.cpu().double(), lse.cpu().double()
    for b in range(batch):
        splits = int(num_splits[b])
        if splits == 1:  # the split kernel wrote such sequences itself: the combine leaves them alone
            assert (out[b * q_len:(b + 1) * q_len] == 7.0).all() and (lse[b] == 7.0).all()
            continue
        lses = part_lse[b, :splits, :rows].double().cpu()
        expected_lse = torch.logsumexp(lses, 0)
        weights = torch.exp(lses - torch.where(expected_lse.isinf(), 0.0, expected_lse)).nan_to_num()
        expected = (part_out[b, :splits, :rows].double().cpu() * weights[..., None]).sum(0)
        got = out[b * q_len:(b + 1) * q_len].reshape(rows, kv_lora_rank)
        assert torch.allclose(got, expected, atol=1e-5), (b, (got - expected).abs().max())
        got_lse = lse[b].transpose(0, 1).reshape(rows)
        assert torch.equal(got_lse.isinf(), expected_lse.isinf())
        finite = ~expected_lse.isinf()
        assert torch.allclose(got_lse[finite], expected_lse[finite], atol=1e-5)


class _BlockRecorder:
    """Stands in for the portable split kernel and records the row tile of each launch."""

    def __init__(self, kernel):
        self.kernel, self.block_m = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.block_m.append(kwargs["BLOCK_M"])
            return launch(*args, **kwargs)

        return run


@pytest.mark.parametrize("hopper_default, launched_block_m", [(True, 16), (False, 64)])
def test_a_hopper_tile_plan_the_hopper_kernel_refuses_runs_the_portable_tile(
    hopper_default, launched_block_m, kernel_device, monkeypatch
):
    batch = make_paged_batch([300, 0, 57], heads=4, page_size=16, kv_dtype="fp8_e4m3", scale_layout="group", seed=9,
                             device=kernel_device)
    hopper_tile = plan_decode(batch.cache_seqlens, q_len=1, heads=4, num_sms=8, tuning=default_tuning(4, hopper_tier=True))
    plan = dataclasses.replace(hopper_tile, hopper_default=hopper_default)
    recorder = _BlockRecorder(triton_decode._mla_decode_split_kernel)
    monkeypatch.setattr(triton_decode, "_mla_decode_split_kernel", recorder)
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=64,
                                 softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, plan=plan)
    assert recorder.block_m == [launched_block_m]
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 3e-2
    assert_lse_close(lse, expected_lse, atol=3e-2)


def _plan_inputs(lengths: list[int], q_lens: list[int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    cu_seqlens_q = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return torch.tensor(lengths, dtype=torch.int32, device=device), cu_seqlens_q.to(device)


def _check_plan(lengths: torch.Tensor, cu_seqlens_q: torch.Tensor, geometry, plan, block_n: int, min_tiles: int = 1):
    """Checks a balanced plan against its definition and returns each part's tile count: every sequence's
    items in batch order, adjacent, covering its tiles once in order; item counts, query segments and
    partial slots as documented; parts consecutive runs of items."""
    counts, first_slots, work, part_items = (t.cpu() for t in plan)
    lengths, cu_seqlens_q = lengths.cpu(), cu_seqlens_q.cpu()
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    tiles = torch.where(q_lens > 0, (lengths + block_n - 1) // block_n, 0)
    items = int(counts.sum())
    assert work.shape == (geometry.work_rows, 7) and items <= geometry.work_rows
    assert torch.equal(work[:items, 0], torch.arange(len(lengths)).repeat_interleave(counts.long()).to(torch.int32))
    row = 0
    for b in range(len(lengths)):
        run = work[row:row + int(counts[b])]
        assert (run[:, 1] == counts[b]).all() and (run[:, 2] == cu_seqlens_q[b]).all() and (run[:, 3] == q_lens[b]).all()
        assert run[0, 4] == 0 and torch.equal(run[1:, 4], run[:-1, 5]), "tokens once, in order"
        assert run[-1, 5] == (lengths[b] if tiles[b] > 0 else 0)
        assert (run[:-1, 5] % block_n == 0).all(), "items cut at whole tiles"
        assert (run[:, 5] > run[:, 4]).all() or (tiles[b] == 0 and counts[b] == 1), "no empty item"
        if counts[b] > 1:
            assert torch.equal(run[:, 6], first_slots[b] + torch.arange(int(counts[b]), dtype=torch.int32))
        row += int(counts[b])
    slots = torch.cat([work[:items][work[:items, 1] > 1, 6]])
    assert slots.unique().numel() == slots.numel() and (slots < geometry.partial_slots).all()
    assert part_items.shape == (geometry.parts + 1,) and part_items[0] == 0 and part_items[-1] == items
    assert (part_items[1:] >= part_items[:-1]).all()
    share = max(-(-int(tiles.sum()) // geometry.parts), min_tiles)
    item_tiles = (work[:items, 5] - work[:items, 4] + block_n - 1) // block_n
    part_tiles = torch.tensor([int(item_tiles[a:z].sum())
                               for a, z in zip(part_items[:-1].tolist(), part_items[1:].tolist())])
    busy = tiles[tiles > 0]
    ragged = busy.numel() > 0 and int(busy.max()) * busy.numel() * 4 > int(tiles.sum()) * 5
    if ragged:
        used = -(-int(tiles.sum()) // share)
        assert (part_tiles[:used - 1] == share).all() and (part_tiles[used - 1:] <= share).all(), "cuts every share"
    else:
        per_part = part_items[1:] - part_items[:-1]
        assert int(per_part.max() - per_part.min()) <= 1, "items dealt out evenly"
        for b in range(len(lengths)):
            runs = item_tiles[work[:items, 0] == b]
            assert (runs[:-1] == runs[0]).all() and runs[-1] <= runs[0], "equal runs, the last one at most as long"
    return part_tiles, ragged


def test_balanced_plan_follows_the_documented_example(kernel_device):
    lengths, cu_seqlens_q = _plan_inputs([4096, 64, 0], [1, 1, 1], kernel_device)
    geometry = split_geometry(batch=3, rows=64, block_m=64, num_sms=8)
    plan = balanced_plan(lengths, cu_seqlens_q, geometry, block_n=64)
    assert plan.counts.tolist() == [8, 1, 1]
    even = balanced_plan(*_plan_inputs([4096, 4096], [1, 1], kernel_device),
                         split_geometry(batch=2, rows=64, block_m=64, num_sms=8), block_n=64)
    assert even.counts.tolist() == [4, 4] and even.part_items.tolist() == list(range(9))
    assert plan.part_items.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 10]
    tile_runs = [[0, 9], [9, 18], [18, 27], [27, 36], [36, 45], [45, 54], [54, 63], [63, 64], [0, 1], [0, 0]]
    assert plan.work[:10, 4:6].tolist() == [[64 * a, 64 * z] for a, z in tile_runs]
    _check_plan(lengths, cu_seqlens_q, geometry, plan, 64)


@pytest.mark.parametrize("batch, num_sms, block_m", [(1, 132, 64), (3, 132, 64), (37, 64, 16), (64, 132, 64), (2000, 8, 64)])
def test_balanced_plan_parts_are_even_whatever_the_lengths(batch, num_sms, block_m, kernel_device):
    gen = torch.Generator().manual_seed(batch)
    lengths = torch.randint(0, 20000, (batch,), generator=gen)
    lengths[::7] = 0
    lengths[0] = 16384
    q_lens = torch.randint(0, 3, (batch,), generator=gen)
    q_lens[0] = 1
    lengths, cu_seqlens_q = _plan_inputs(lengths.tolist(), q_lens.tolist(), kernel_device)
    geometry = split_geometry(batch=batch, rows=2 * 128, block_m=block_m, num_sms=num_sms)
    plan = balanced_plan(lengths, cu_seqlens_q, geometry, block_n=64, min_tokens_per_split=128)
    _, ragged = _check_plan(lengths, cu_seqlens_q, geometry, plan, 64, min_tiles=2)
    assert ragged == (batch > 1), "one sequence is even, these batches ragged"


@pytest.mark.parametrize("lengths, parts", [([4096] * 5, 8), ([4096] * 5, 3), ([1024, 1200, 900, 0], 132), ([300] * 40, 16)])
def test_even_batches_deal_equal_runs_to_the_parts(lengths, parts, kernel_device):
    lengths, cu_seqlens_q = _plan_inputs(lengths, [1] * len(lengths), kernel_device)
    geometry = split_geometry(batch=len(lengths), rows=64, block_m=64, num_sms=parts)
    plan = balanced_plan(lengths, cu_seqlens_q, geometry, block_n=64)
    part_tiles, ragged = _check_plan(lengths, cu_seqlens_q, geometry, plan, 64)
    assert not ragged and int(plan.counts.sum()) <= geometry.work_rows


def test_balanced_plan_of_empty_batches_runs_each_sequence_once(kernel_device):
    lengths, cu_seqlens_q = _plan_inputs([0, 0, 0], [1, 1, 0], kernel_device)
    geometry = split_geometry(batch=3, rows=16, block_m=16, num_sms=4, programs_per_sm=4)
    plan = balanced_plan(lengths, cu_seqlens_q, geometry, block_n=32)
    _check_plan(lengths, cu_seqlens_q, geometry, plan, 32)
    assert plan.counts.tolist() == [1, 1, 1] and int(plan.part_items[-1]) == 3


def test_fixed_split_plans_list_every_split_in_batch_order(kernel_device):
    batch = make_paged_batch([300, 0, 45], heads=3, q_len=2, page_size=16, seed=9, device=kernel_device)
    tuning = DecodeTuning(16, 32, 4, fixed_splits=3)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=3, tuning=tuning)
    work = plan.work.cpu()
    assert work[:, 0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and (work[:, 1] == 3).all()
    assert work[:, 4:6].tolist() == [[0, 128], [128, 256], [256, 300], [0, 0], [0, 0], [0, 0], [0, 32], [32, 45], [45, 45]]
    assert work[:, 6].tolist() == list(range(9)) and plan.part_items.tolist() == list(range(10))
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                 kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=None, plan=plan)
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 1e-2
    assert_lse_close(lse, expected_lse, atol=1e-3)


def test_a_plan_for_another_batch_is_refused(kernel_device):
    batch = make_paged_batch([30, 7], heads=2, page_size=16, seed=3, device=kernel_device)
    plan = plan_decode(batch.cache_seqlens[:1], q_len=1, heads=2)
    with pytest.raises(ValueError, match="plan: built for 1 sequences, the call has 2"):
        triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=batch.kv_lora_rank,
                          softmax_scale=batch.softmax_scale, kv_scale=None, plan=plan)


def test_plan_refuses_more_work_rows_than_the_grid_holds():
    with pytest.raises(ValueError, match=r"cache_seqlens: the plan needs 655\d\d work rows, more than the launch grid holds"):
        plan_decode(torch.ones(65530, dtype=torch.int32), q_len=1, heads=16)
    with pytest.raises(ValueError, match="cache_seqlens: the plan needs 65536 work rows"):
        plan_decode(torch.ones(8192, dtype=torch.int32), q_len=1, heads=16, tuning=DecodeTuning(16, 32, 4, fixed_splits=8))


def test_forcing_many_splits_gives_the_same_result(kernel_device):
    batch = make_paged_batch([300, 45], heads=4, page_size=16, seed=5, device=kernel_device)
    kwargs = dict(kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=None)
    one_split, one_lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, num_sms=1, **kwargs)
    many, many_lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, num_sms=64, **kwargs)
    assert relative_error(many, one_split.double()) < 1e-2
    assert torch.allclose(many_lse, one_lse, atol=1e-4)


EXTEND_CASES = [
    # prefix lengths, new tokens, heads, page_size, kv_dtype, scale_layout, num_sms
    ([9, 0, 30], [4, 7, 1], 3, 4, "bf16", "tensor", 4),
    ([0, 0], [5, 2], 1, 16, "fp16", "tensor", 4),
    ([100, 3], [3, 0], 5, 8, "bf16", "tensor", 64),
    ([40, 17], [2, 6], 2, 1, "fp8_e4m3", "group", 16),
    ([120], [20], 4, 32, "fp8_e4m3", "tensor", 4),
]


@pytest.mark.parametrize("prefix, new, heads, page_size, kv_dtype, scale_layout, num_sms", EXTEND_CASES)
def test_triton_extend_matches_reference(prefix, new, heads, page_size, kv_dtype, scale_layout, num_sms, kernel_device):
    lengths = [p + n for p, n in zip(prefix, new)]
    batch = make_paged_batch(
        lengths, heads=heads, page_size=page_size, kv_dtype=kv_dtype, scale_layout=scale_layout,
        q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16, seed=sum(lengths), device=kernel_device,
    )
    gen = torch.Generator().manual_seed(len(new))
    q = torch.randn(sum(new), heads, batch.q.shape[-1], generator=gen).to(batch.q.dtype).to(kernel_device)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=kernel_device)
    kwargs = dict(kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    out, lse = triton_mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, max_q_len=max(new),
                                 num_sms=num_sms, **kwargs)
    expected_out, expected_lse = reference_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu,
                                                  compute_dtype=torch.float64, **kwargs)
    assert out.shape == expected_out.shape and lse.shape == expected_lse.shape
    assert torch.isfinite(out.float()).all()
    fp8 = kv_dtype == "fp8_e4m3"
    assert relative_error(out, expected_out) < (3e-2 if fp8 else 1e-2)
    assert_lse_close(lse, expected_lse, atol=3e-2 if fp8 else 1e-3)


def test_decode_tuning_names_a_known_tier():
    with pytest.raises(ValueError, match="tier"):
        DecodeTuning(64, 64, 8, tier="hoper")
