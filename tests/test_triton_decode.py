"""The portable Triton decode kernel against the float64 oracle (CPU interpreter, small shapes)."""

import dataclasses
import functools
import itertools

import numpy as np
import pytest
import torch
import triton

from mlakit.cache.kv_quant import scale_mode
from mlakit.errors import MLAInputError
from mlakit.kernels import decode_split_plan, hopper_narrow_decode, triton_decode
from mlakit.kernels.decode_split_plan import SplitGeometry, decode_split_counts, split_geometry
from mlakit.kernels.hopper_decode import dispatch
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
# float32 partials, bf16 ones (the seesaw's for a bf16 output), or fp16 ones in the cache's units (narrow)
@pytest.mark.parametrize("part_dtype, part_scale", [(torch.float32, None), (torch.bfloat16, None),
                                                    (torch.float16, 0.37)])
def test_combine_merges_keyless_splits_and_ignores_unused_ones(max_splits, part_dtype, part_scale, kernel_device):
    _check_combine(max_splits, part_dtype, part_scale, kernel_device)


# Behind a seesaw that merges every plan but an equal-share one itself: the combine merges a share plan's splits only
@pytest.mark.parametrize("order", ["shares", "waves", "taken"])
def test_share_only_combine_merges_a_share_plan_alone(order, kernel_device):
    _check_combine(4, torch.bfloat16, None, kernel_device, order)


def _check_combine(max_splits: int, part_dtype: torch.dtype, part_scale: float | None, kernel_device: torch.device,
                   only_shares_order: str | None = None) -> None:
    """The combine kernel over random partials (keyless rows and splits, garbage past each sequence's splits) against
    their lse-weighted sum; `only_shares_order`: with ONLY_SHARES over a plan of that order ("shares", "waves",
    "taken"), where only a share plan's sequences are merged."""
    heads, q_len, kv_lora_rank, batch = 3, 2, 64, 4
    rows, padded_rows = heads * q_len, 16
    gen = torch.Generator().manual_seed(max_splits)
    num_splits = torch.tensor([max_splits, max_splits - 3, 1, 2], dtype=torch.int32)
    part_out = (torch.randn(batch, max_splits, padded_rows, kv_lora_rank, generator=gen) * 100).to(part_dtype)
    part_lse = torch.randn(batch, max_splits, padded_rows, generator=gen) * 5
    part_lse[0, ::3, 1] = float("-inf")  # splits that saw no key of a row ...
    part_lse[0, :, 2] = float("-inf")  # ... every split of a row (lse -inf, output 0) ...
    part_lse[3] = float("-inf")  # ... and of a whole sequence
    part_out[part_lse == float("-inf")] = 0.0
    for b in range(batch):  # partials past a sequence's splits hold garbage the combine must not read
        part_lse[b, num_splits[b]:] = float("nan")
        part_out[b, num_splits[b]:] = float("nan")
    out = torch.full((batch * q_len, heads, kv_lora_rank), 7.0)
    lse = torch.full((batch, heads, q_len), 7.0)
    scale = torch.tensor([part_scale or 3.0])  # without SCALED_PARTS the combine must not read it
    part_out, part_lse, out, lse, scale = (t.to(kernel_device) for t in (part_out, part_lse, out, lse, scale))
    only_shares = only_shares_order is not None
    if only_shares:
        tiling = triton_decode.share_combine_tiling(kv_lora_rank)
        order = getattr(decode_split_plan, f"ORDER_{only_shares_order.upper()}").value
        work_state = torch.tensor([5, 3, order], dtype=torch.int32, device=kernel_device)
    else:
        tiling = triton_decode.combine_tiling(max_splits, kv_lora_rank)
        # Without ONLY_SHARES the combine must not read it: a plan of another order fills it.
        work_state = torch.full((3,), decode_split_plan.ORDER_WAVES.value, dtype=torch.int32, device=kernel_device)
    cu_seqlens_q = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=kernel_device)
    triton_decode._mla_decode_combine_kernel[(batch, -(-rows // tiling.rows), -(-kv_lora_rank // tiling.columns))](
        part_out, part_lse, num_splits.to(kernel_device), cu_seqlens_q, out, lse,
        (part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1)),
        (out.stride(0), out.stride(1)), (0, lse.stride(0), lse.stride(2), lse.stride(1)), scale, work_state,
        HEADS=heads, KV_LORA_RANK=kv_lora_rank, BLOCK_SPLITS=tiling.splits, BLOCK_ROWS=tiling.rows,
        BLOCK_C=tiling.columns, SCALED_PARTS=part_scale is not None, ONLY_SHARES=only_shares, num_warps=tiling.warps,
    )
    out, lse = out.cpu().double(), lse.cpu().double()
    merged_here = only_shares_order in (None, "shares")
    for b in range(batch):
        splits = int(num_splits[b])
        # The split kernel wrote single-split sequences itself, and the seesaw merged a plan's of other orders: the
        # combine leaves them alone.
        if splits == 1 or not merged_here:
            assert (out[b * q_len:(b + 1) * q_len] == 7.0).all() and (lse[b] == 7.0).all()
            continue
        lses = part_lse[b, :splits, :rows].double().cpu()
        expected_lse = torch.logsumexp(lses, 0)
        weights = torch.exp(lses - torch.where(expected_lse.isinf(), 0.0, expected_lse)).nan_to_num()
        expected = (part_out[b, :splits, :rows].double().cpu() * weights[..., None]).sum(0) * (part_scale or 1.0)
        got = out[b * q_len:(b + 1) * q_len].reshape(rows, kv_lora_rank)
        assert torch.allclose(got, expected, atol=1e-3, rtol=1e-5), (b, (got - expected).abs().max())
        got_lse = lse[b].transpose(0, 1).reshape(rows)
        assert torch.equal(got_lse.isinf(), expected_lse.isinf())
        finite = ~expected_lse.isinf()
        assert torch.allclose(got_lse[finite], expected_lse[finite], atol=1e-5)


class _BlockRecorder:
    """Stands in for the portable split kernel's launcher and records the row tile of each launch."""

    def __init__(self, launch):
        self.launch, self.block_m = launch, []

    def __call__(self, key, grid, args, constants):
        self.block_m.append(constants["BLOCK_M"])
        self.launch(key, grid, args, constants)


@pytest.mark.parametrize("hopper_default, launched_block_m", [(True, 16), (False, 64)])
def test_a_hopper_tile_plan_the_hopper_kernel_refuses_runs_the_portable_tile(
    hopper_default, launched_block_m, kernel_device, monkeypatch
):
    batch = make_paged_batch([300, 0, 57], heads=4, page_size=16, kv_dtype="fp8_e4m3", scale_layout="group", seed=9,
                             device=kernel_device)
    hopper_tile = plan_decode(batch.cache_seqlens, q_len=1, heads=4, num_sms=8, tuning=default_tuning(4, hopper_tier=True))
    plan = dataclasses.replace(hopper_tile, hopper_default=hopper_default)
    recorder = _BlockRecorder(triton_decode._SPLIT)
    monkeypatch.setattr(triton_decode, "_SPLIT", recorder)
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=64,
                                 softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, plan=plan)
    assert recorder.block_m == [launched_block_m]
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 3e-2
    assert_lse_close(lse, expected_lse, atol=3e-2)


def test_split_counts_follow_the_documented_formula(kernel_device):
    one_token_each = torch.arange(4, dtype=torch.int32, device=kernel_device)
    even = torch.tensor([4096, 4096, 0], dtype=torch.int32, device=kernel_device)
    def counts(*args, **kwargs):
        return decode_split_counts(*args, **kwargs).counts.tolist()

    split = functools.partial(counts, even, one_token_each, 64, block_m=64, block_n=64)
    assert split(SplitGeometry(1, 16), num_sms=4) == [4, 4, 1]  # 128 tiles / 8 programs: 16 per split
    assert split(SplitGeometry(1, 3), num_sms=4) == [3, 3, 1]
    assert split(SplitGeometry(1, 64), num_sms=64, min_tokens_per_split=64 * 32) == [2, 2, 1]
    # Ragged (the busiest sequence has 64 of 65 tiles): the work is spread over twice the programs.
    lengths = torch.tensor([4096, 64, 0], dtype=torch.int32, device=kernel_device)
    split = functools.partial(counts, lengths, one_token_each, 64, block_m=64, block_n=64)
    assert split(SplitGeometry(1, 16), num_sms=4) == [13, 1, 1]  # 65 tiles / 16 programs: 5 per split
    assert split(SplitGeometry(1, 8), num_sms=4) == [8, 1, 1]
    # Sequence 0 with 3 query tokens (3 row tiles) counts three times the work: fewer tiles per split elsewhere.
    ragged_queries = torch.tensor([0, 3, 4, 5], dtype=torch.int32, device=kernel_device)
    assert counts(lengths, ragged_queries, 64, SplitGeometry(3, 64), 64, 64, num_sms=4) == [5, 1, 1]
    # Sixteen busy sequences take splits of at least the batched minimum; one busy among empty ones does not.
    sixteen = torch.full((16,), 1024, dtype=torch.int32, device=kernel_device)
    one_each = torch.arange(17, dtype=torch.int32, device=kernel_device)
    batched = functools.partial(counts, geometry=SplitGeometry(1, 25), block_m=64, block_n=64, num_sms=132,
                                programs_per_sm=1, min_tokens_per_split=128, batched_min_tokens_per_split=256)
    assert batched(sixteen, one_each, 16) == [4] * 16  # 256 tiles / 132 programs: 2 a split, raised to 4
    assert batched(torch.tensor([1024] + [0] * 15, dtype=torch.int32, device=kernel_device), one_each, 16)[0] == 8


def _split_counts(device: str, lengths: list[int], q_lens: list[int], heads: int, block_m: int, programs_per_sm: int,
                  unit_cost: int = 0) -> list[int]:
    """`decode_split_counts`' counts for sequences of `lengths` tokens and `q_lens` query tokens on 132 SMs (64-token
    tiles, the split ceiling of `split_geometry`)."""
    cu_seqlens_q = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    geometry = split_geometry(len(lengths), heads * max(q_lens), block_m, 132, programs_per_sm)
    return decode_split_counts(seqlens, cu_seqlens_q, heads, geometry, block_m=block_m, block_n=64, num_sms=132,
                               programs_per_sm=programs_per_sm, unit_cost_tiles=unit_cost).counts.tolist()


def test_split_counts_grow_where_the_nearest_would_overflow_one_wave(kernel_device, monkeypatch):
    """16 heads x 2 query tokens in 16-row tiles (two a sequence), 264 programs at once: 48 sequences of 64 KV tiles
    are 6144 tile-rows, 24 tiles a split, 3 splits to the nearest (288 programs); at 26 tiles a split 2 (192); 24
    sequences of one token take 6 tiles a split, 11 splits to the nearest, exactly 264 programs, kept; an uneven
    batch sheds only the splits it must; a ragged batch keeps the nearest counts."""
    def counts(lengths: list[int], q_len: int) -> list[int]:
        return _split_counts(kernel_device, lengths, [q_len] * len(lengths), heads=16, block_m=16, programs_per_sm=2)

    assert counts([4096] * 48, 2) == [2] * 48
    assert counts([4096] * 24, 1) == [11] * 24
    assert counts([4096] * 24 + [0], 1) == [11] * 24 + [1]  # only the busy sequences' programs count
    # 80 sequences within 20% of 16384 tokens (not ragged): 272 programs to the nearest, 256 grown; rounding every
    # count down would leave 160.
    gen = torch.Generator().manual_seed(5)
    uneven = (16384 * (1 + 0.2 * (2 * torch.rand(80, generator=gen) - 1))).round().int().tolist()
    assert 2 * sum(counts(uneven, 2)) == 256
    # Ragged (the busiest has 256 of a mean 37 KV tiles): 3520 tile-rows over 528 programs, 7 tiles a split; the short
    # sequences' 32 tiles take 5 splits to the nearest (4 down), 488 programs in all.
    assert counts([16384] + [2048] * 47, 2)[:2] == [9, 5]
    monkeypatch.setattr(decode_split_plan, "FIT_SPLITS_TO_ONE_WAVE", False)
    assert counts([4096] * 48, 2) == [3] * 48
    assert 2 * sum(counts(uneven, 2)) == 272


def test_split_counts_take_more_waves_where_a_units_fixed_cost_pays_for_them(kernel_device, monkeypatch):
    """128 heads in 64-row tiles, 132 programs at once, a unit's fixed cost of 13 KV tiles: 24 sequences of 256
    tiles at two query tokens are 96 units in one wave (256 + 13 tiles long), or 4 splits each in three waves of 64
    (3 x 77 = 231); 40 x 128 tiles take 2 splits in three waves (231 against two waves of 141); 64 x 256 tiles and
    24 x 64 tiles keep theirs, as 24 x 128 does (less than a sixteenth shorter in three waves); without the cost, at
    one row tile a sequence and in ragged batches the counts stay; empty sequences and a sequence without query tokens
    count for nothing."""
    monkeypatch.setattr(decode_split_plan, "EQUAL_SHARES", False)  # some of these batches take shares (below)

    def counts(lengths: list[int], q_lens: list[int], heads: int = 128, unit_cost: int = 13) -> list[int]:
        return _split_counts(kernel_device, lengths, q_lens, heads, block_m=64, programs_per_sm=1, unit_cost=unit_cost)

    def uniform(sequences: int, tiles: int, q_len: int, heads: int = 128, unit_cost: int = 13) -> set[int]:
        return set(counts([64 * tiles] * sequences, [q_len] * sequences, heads, unit_cost))

    assert uniform(24, 256, 2) == {4}
    assert uniform(24, 256, 2, unit_cost=0) == {1}
    assert uniform(40, 128, 2) == {2}
    assert uniform(24, 256, 1) == {5}  # two row tiles: 2 splits in one wave (141), 5 in two (2 x 65)
    assert uniform(64, 256, 2) == uniform(24, 64, 2) == {1}
    assert uniform(24, 128, 2) == {1}  # 4 splits: 3 x (32 + 13) = 135 against 141, less than a sixteenth shorter
    # One 64-row tile a sequence (64 heads, one token): one wave (1 split, where 4 in three waves would be 3 x 77).
    assert uniform(96, 256, 1, heads=64) == {1}
    # Ragged (one sequence of 1024 tiles among 64-tile ones): the ragged rule's counts, with or without the cost.
    ragged = [65536] + [4096] * 23
    assert counts(ragged, [2] * 24) == counts(ragged, [2] * 24, unit_cost=0) == [5] + [3] * 23
    assert counts([16384] * 24 + [0] * 8, [2] * 32) == [4] * 24 + [1] * 8
    assert counts([16384] * 24 + [1 << 20], [2] * 24 + [0]) == [4] * 25


def test_split_plan_balances_ragged_lengths_and_bounds_splits(kernel_device):
    lengths = torch.tensor([16384, 256, 0, 4096], dtype=torch.int32, device=kernel_device)
    geometry = split_geometry(batch=4, rows=128, block_m=64, num_sms=132)
    one_token_each = torch.arange(5, dtype=torch.int32, device=kernel_device)
    splits, _, _ = decode_split_counts(lengths, one_token_each, 128, geometry, block_m=64, block_n=64, num_sms=132)
    assert splits.dtype == torch.int32 and splits.tolist()[2] == 1
    assert (splits >= 1).all() and (splits <= geometry.max_splits).all()
    splits, lengths = splits.cpu(), lengths.cpu()
    tiles = (lengths + 63) // 64
    per_split = (tiles + splits - 1) // splits
    busy = per_split[lengths > 0]
    assert busy.max() <= 2 * busy.min() + 1, "splits of long and short sequences should hold similar tile counts"
    big_batch = split_geometry(batch=128, rows=128, block_m=64, num_sms=132)
    assert big_batch.max_splits == 4


def test_ragged_splits_hold_as_many_tiles_at_two_query_tokens_as_at_one(kernel_device):
    """At 128 heads two query tokens double a sequence's row tiles; a ragged batch's splits aim at twice as many
    programs then, so a split holds about the batch's KV tiles over its programs at one token and at two (the short
    sequences; the longest is capped by the split ceilings, 25 at one token and 13 at two, and then lowered to the
    splits its tiles fill: 22 and 13)."""
    lengths = torch.tensor([8192] + [1024] * 7, dtype=torch.int32, device=kernel_device)
    splits = {}
    for q_len in (1, 2):
        cu_seqlens_q = torch.arange(9, dtype=torch.int32, device=kernel_device) * q_len
        geometry = split_geometry(batch=8, rows=128 * q_len, block_m=64, num_sms=132, programs_per_sm=1)
        splits[q_len], _, state = decode_split_counts(lengths, cu_seqlens_q, 128, geometry, block_m=64, block_n=64,
                                                      num_sms=132, programs_per_sm=1)
        assert int(state[2]) == 1, "the batch is ragged"
    # One token: 240 tiles x 2 row tiles over 2 x 132 programs, 2 tiles a split; two tokens: x 4 over 4 x 132.
    assert splits[1].tolist() == [22] + [8] * 7
    assert splits[2].tolist() == [13] + [8] * 7


def _sequences_in_launch_order(splits: torch.Tensor, work: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """Checks the work items' layout (every split of every sequence once, a sequence's splits adjacent and
    in order, zeros past the last item) and returns the sequences in the order their splits come."""
    count = int(items[0])
    assert count == int(splits.sum()) and items[1] == 0, "the item count, then the unit counter at zero"
    assert items[2] in (0, 1)
    assert (work[count:] == 0).all(), "unused rows must name no split"
    sequences = torch.unique_consecutive(work[:count, 0])
    assert sorted(sequences.tolist()) == list(range(splits.numel())), "each sequence's splits adjacent, once"
    expected_splits = torch.cat([torch.arange(int(splits[b])) for b in sequences.long()])
    assert torch.equal(work[:count, 1], expected_splits.to(torch.int32))
    assert torch.equal(work[:count, 2], splits[work[:count, 0].long()])
    return sequences


def test_work_items_list_every_split_longest_first(kernel_device):
    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(0, 9000, (37,), generator=gen, dtype=torch.int32)
    lengths[[3, 20]] = 0
    q_lens = torch.randint(0, 3, (37,), generator=gen, dtype=torch.int32)
    cu_seqlens_q = torch.cat([torch.zeros(1, dtype=torch.int32), q_lens.cumsum(0).to(torch.int32)])
    geometry = split_geometry(batch=37, rows=2 * 16, block_m=16, num_sms=64)
    splits, work, items = decode_split_counts(lengths.to(kernel_device), cu_seqlens_q.to(kernel_device), 16, geometry,
                                              block_m=16, block_n=64, num_sms=64)
    splits, work, items = splits.cpu(), work.cpu(), items.cpu()
    assert work.shape[0] == 37 * geometry.max_splits and splits.max() > 1
    order = _sequences_in_launch_order(splits, work, items)
    taken = work[: int(items[0]), 0].long()
    assert torch.equal(work[: int(items[0]), 3], cu_seqlens_q[taken]) and torch.equal(work[: int(items[0]), 4], q_lens[taken])
    tiles = (lengths + 63) // 64
    # Each split's KV tokens: cdiv(tiles, splits) tiles from split x that, the last one open-ended.
    split, count = work[: int(items[0]), 1], work[: int(items[0]), 2]
    span = (tiles[taken] + count - 1) // count * 64
    assert torch.equal(work[: int(items[0]), 5], split * span)
    assert torch.equal(work[: int(items[0]), 6], torch.where(split == count - 1, decode_split_plan.OPEN_KV_END.value,
                                                             (split + 1) * span))
    busy = (tiles > 0) & (q_lens > 0)
    per_split = torch.where(busy, (tiles + splits - 1) // splits, 0)[order.long()]
    assert (per_split[:-1] >= per_split[1:]).all(), "longest splits first"
    for size in per_split.unique().tolist():  # ties keep batch order
        same = order[per_split == size]
        assert (same[:-1] < same[1:]).all()


def test_every_split_holds_tiles_and_large_batches_keep_batch_order(kernel_device):
    gen = torch.Generator().manual_seed(11)
    for batch, num_sms in ((3, 132), (40, 132), (2000, 8)):
        lengths = torch.randint(0, 20000, (batch,), generator=gen, dtype=torch.int32)
        lengths[0] = 16384
        one_token_each = torch.arange(batch + 1, dtype=torch.int32)
        geometry = split_geometry(batch=batch, rows=128, block_m=64, num_sms=num_sms)
        splits, work, items = decode_split_counts(lengths.to(kernel_device), one_token_each.to(kernel_device), 128,
                                                  geometry, block_m=64, block_n=64, num_sms=num_sms,
                                                  min_tokens_per_split=128)
        splits, work, items = splits.cpu(), work.cpu(), items.cpu()
        tiles = (lengths + 63) // 64
        per_split = (tiles + splits - 1) // splits
        assert ((splits - 1) * per_split < tiles)[tiles > 0].all(), "the kernels' last split would be empty"
        order = _sequences_in_launch_order(splits, work, items)
        if batch > 1024:
            assert torch.equal(order, torch.arange(batch, dtype=torch.int32))


def test_the_kernel_reads_each_splits_kv_range_from_the_plan(kernel_device):
    """Both splits of sequence 0 edited to cover all its tokens: the merged output stays, its lse grows by ln 2 (each
    key counted twice); sequence 1, untouched, keeps the oracle's."""
    batch = make_paged_batch([300, 170], heads=3, q_len=2, page_size=16, seed=10, device=kernel_device)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=3, tuning=DecodeTuning(16, 32, 4, fixed_splits=2))
    plan.work[:2, 5] = 0
    plan.work[:2, 6] = decode_split_plan.OPEN_KV_END.value
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                 kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=None, plan=plan)
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 1e-2
    assert_lse_close(lse[0], expected_lse[0] + np.log(2), atol=1e-3)
    assert_lse_close(lse[1], expected_lse[1], atol=1e-3)


def test_fixed_split_plans_list_every_split_in_batch_order(kernel_device):
    """Three splits a sequence, empty ones too, each of cdiv(tiles, 3) 32-token tiles (10 tiles: 4, 4, the rest;
    the last split open-ended), in batch order."""
    batch = make_paged_batch([300, 0, 45], heads=3, q_len=2, page_size=16, seed=9, device=kernel_device)
    tuning = DecodeTuning(16, 32, 4, fixed_splits=3)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=3, tuning=tuning)
    order = _sequences_in_launch_order(plan.num_splits.cpu(), plan.work.cpu(), plan.work_state.cpu())
    assert order.tolist() == [0, 1, 2]
    assert plan.num_splits.tolist() == [3, 3, 3]
    assert plan.work_state.tolist() == [9, 0, decode_split_plan.ORDER_WAVES.value]
    assert plan.work[:, 3:5].tolist() == [[0, 2]] * 3 + [[2, 2]] * 3 + [[4, 2]] * 3  # first query token, tokens
    open_end = decode_split_plan.OPEN_KV_END.value
    assert plan.work[:, 5:].tolist() == [[0, 128], [128, 256], [256, open_end], [0, 0], [0, 0], [0, open_end],
                                         [0, 32], [32, 64], [64, open_end]]
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                 kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=None, plan=plan)
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 1e-2
    assert_lse_close(lse, expected_lse, atol=1e-3)


def test_split_counts_below_one_or_above_the_ceiling_are_refused():
    with pytest.raises(ValueError, match="DecodeTuning.fixed_splits: expected None or at least 1, got 0"):
        DecodeTuning(16, 32, 4, fixed_splits=0)
    with pytest.raises(ValueError, match="forced_splits: expected 0 .none. to the split ceiling 2, got 3"):
        decode_split_counts(torch.ones(2, dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32), 4,
                            SplitGeometry(row_tiles=1, max_splits=2), 16, 32, num_sms=4, forced_splits=3)


@pytest.mark.parametrize("planned_lengths", [[10, 500, 0], [300, 1, 45], [0, 0, 0]])
def test_a_plan_built_for_other_lengths_splits_badly_but_never_wrongly(planned_lengths, kernel_device):
    """The kernels split the call's lengths by the plan's split counts: a plan reused after the lengths
    changed (longer, shorter, emptied) still covers every token once."""
    batch = make_paged_batch([300, 0, 45], heads=3, q_len=2, page_size=16, seed=13, device=kernel_device)
    planned = torch.tensor(planned_lengths, dtype=torch.int32, device=kernel_device)
    expected_out, expected_lse = naive_decode(batch)
    for tuning in (None, DecodeTuning(16, 32, 4, fixed_splits=3)):
        plan = plan_decode(planned, q_len=2, heads=3, num_sms=16, tuning=tuning)
        out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                     kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale, kv_scale=None,
                                     plan=plan)
        assert relative_error(out, expected_out) < 1e-2
        assert_lse_close(lse, expected_lse, atol=1e-3)


def test_an_output_of_another_dtype_than_the_queries_is_refused():
    batch = make_paged_batch([30, 7], heads=2, page_size=16, seed=3)
    out = torch.empty(2, 2, batch.kv_lora_rank, dtype=torch.float32)
    with pytest.raises(MLAInputError, match="out: expected the queries' dtype torch.bfloat16, got torch.float32"):
        triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=batch.kv_lora_rank,
                          softmax_scale=batch.softmax_scale, kv_scale=None, out=out)


@pytest.mark.parametrize("order, merged", [("SHARES", True), ("WAVES", False), ("TAKEN", False)])
def test_a_pass_merging_all_but_shares_gets_a_share_only_combine(order, merged, monkeypatch):
    """Where the Hopper pass merges every plan but an equal-share one itself (`Merges.ALL_BUT_SHARES`), the launch runs
    the share-only combine behind it, which merges the split sequences of a share plan and leaves other plans' to the
    pass (here the portable pass stands in for it and merges nothing: their rows keep what the output held). The pass
    is told whether the plan may take shares (`DecodePlan.may_share`), as it decides whether to merge them."""
    batch = make_paged_batch([900, 0, 1, 333], heads=3, q_len=2, page_size=16, kv_lora_rank=64, rope_dim=16, seed=7)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=3, kv_dtype=batch.kv_cache.dtype, num_sms=64)
    assert int(plan.num_splits.max()) > 1 and not plan.may_share  # the portable tier's plan on the CPU
    plan = dataclasses.replace(plan, may_share=True)
    plan.work_state[2] = getattr(decode_split_plan, f"ORDER_{order}").value

    def prepare(key, grid, q, pages, kv_lora_rank, work_state, merge_state, max_splits, e4m3_scores, may_share,
                unit_tiles_hint):
        assert may_share, "the plan's may_share reaches the pass"
        split = triton_decode._portable_split(key, grid, q, pages, kv_lora_rank, plan.tuning, scale_mode(pages, None),
                                              (0, 0))
        return split, triton_decode.hopper_decode.Merges.ALL_BUT_SHARES

    monkeypatch.setattr(triton_decode, "split_kernel_for",
                        lambda q, pages, rank, scale_mode, plan: ("hopper", plan.tuning, plan.geometry))
    monkeypatch.setattr(triton_decode.hopper_decode, "prepare", prepare)
    monkeypatch.setattr(triton_decode, "combine_after_split", lambda *args: False)  # no programmatic launch on the CPU
    out = torch.full((*batch.q.shape[:3], 64), float("nan"), dtype=batch.q.dtype)
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=64,
                                 softmax_scale=batch.softmax_scale, kv_scale=None, plan=plan, out=out)
    expected_out, expected_lse = naive_decode(batch)
    split = plan.num_splits > 1
    assert relative_error(out[~split], expected_out[~split]) < 1e-2
    if merged:
        assert relative_error(out[split], expected_out[split]) < 1e-2
        assert_lse_close(lse, expected_lse, atol=1e-3)
    else:
        assert out[split].isnan().all()


@pytest.mark.parametrize("sixteen_bit, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_the_seesaw_pass_gets_the_partials_and_key_partial_dtype_gives(sixteen_bit, expected, monkeypatch):
    """The launch allocates the Hopper pass's partials in `hopper_decode.partial_dtype`'s dtype and keys the pass by
    it, so a setting flipped in one process never reuses the other's kernel or buffer (the pass itself is a GPU
    test; here a recorder stands in for it)."""
    batch = make_paged_batch([300, 0, 57], heads=4, page_size=64, kv_lora_rank=512, rope_dim=64, seed=5)
    recorded = {}

    def prepare(key, *args, **keywords):
        recorded["key"] = key
        return ((lambda q, pages, kv_scale, shared_args: recorded.update(parts=shared_args[5].dtype)),
                triton_decode.hopper_decode.Merges.ALL)

    monkeypatch.setattr(triton_decode, "split_kernel_for",
                        lambda q, pages, rank, scale_mode, plan: ("hopper", plan.tuning, plan.geometry))
    monkeypatch.setattr(triton_decode.hopper_decode, "prepare", prepare)
    monkeypatch.setattr(triton_decode.hopper_decode.dispatch, "SEESAW_16BIT_PARTIALS", sixteen_bit)
    triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=512,
                      softmax_scale=batch.softmax_scale, kv_scale=None, num_sms=8)
    assert recorded["parts"] == expected and expected in recorded["key"]


def test_a_plan_for_another_batch_is_refused(kernel_device):
    batch = make_paged_batch([30, 7], heads=2, page_size=16, seed=3, device=kernel_device)
    plan = plan_decode(batch.cache_seqlens[:1], q_len=1, heads=2)
    with pytest.raises(ValueError, match="plan: built for 1 sequences, the call has 2"):
        triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=batch.kv_lora_rank,
                          softmax_scale=batch.softmax_scale, kv_scale=None, plan=plan)


def test_plan_refuses_more_work_rows_than_the_grid_holds():
    with pytest.raises(ValueError, match="cache_seqlens: 65536 sequences x a split ceiling of 1"):
        plan_decode(torch.ones(65536, dtype=torch.int32), q_len=1, heads=16)
    with pytest.raises(ValueError, match="cache_seqlens: 8192 sequences x a split ceiling of 8"):
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


@pytest.mark.parametrize("q_len", [1, 3])
def test_triton_decode_uses_each_groups_own_fp8_scale(q_len, kernel_device):
    """Three 128-channel scale groups whose scales differ 16-fold: a kernel that applied group 0's
    scale to every channel (issue 27's surviving mutant) is far off the oracle."""
    batch = make_paged_batch([70, 9], heads=3, q_len=q_len, page_size=16, kv_lora_rank=256, rope_dim=32,
                             kv_dtype="fp8_e4m3", scale_layout="group", seed=5, device=kernel_device)
    batch.kv_scale = batch.kv_scale * torch.tensor([1.0, 4.0, 0.25], device=kernel_device)
    out, lse = triton_mla_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        kv_lora_rank=256, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale, num_sms=4,
    )
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 3e-2
    assert_lse_close(lse, expected_lse, atol=3e-2)


def test_the_narrow_kernels_wide_tile_takes_only_large_hinted_batches_of_17_to_32_rows():
    """`wide_narrow_tile`: the 32-row tile where a hint gives every program WIDE_MIN_TILES_PER_PROGRAM KV tiles or
    more, on the narrow tile only, for 17-32 rows a sequence; the threshold scales with the SMs."""
    from mlakit.kernels.triton_decode import default_tuning, wide_narrow_tile

    narrow = default_tuning(32, hopper_tier=True, kv_dtype=torch.float8_e4m3fn)
    enough = hopper_narrow_decode.WIDE_MIN_TILES_PER_PROGRAM * narrow.programs_per_sm * 132 * 64
    for rows, hint, sms, block_m in ((32, enough, 132, 32), (17, enough, 132, 32), (32, enough - 64, 132, 16),
                                     (32, enough, 133, 16), (16, enough, 132, 16), (32, None, 132, 16)):
        assert wide_narrow_tile(narrow, rows, hint, sms, 1).block_m == block_m, (rows, hint, sms)
    # Unhinted, a batch whose 16-row tiles alone overflow the programs that run at once (2 x 133 > 264).
    assert [wide_narrow_tile(narrow, 32, None, 132, batch).block_m for batch in (1, 132, 133, 4096)] == [16, 16, 32, 32]
    assert wide_narrow_tile(narrow, 16, None, 132, 4096).block_m == 16
    seesaw = default_tuning(32, hopper_tier=True, kv_dtype=torch.bfloat16)
    assert wide_narrow_tile(seesaw, 32, enough, 132, 1) == seesaw
    assert wide_narrow_tile(seesaw, 32, None, 132, 4096) == seesaw
    assert wide_narrow_tile(dataclasses.replace(narrow, num_warps=8), 32, enough, 132, 1).block_m == 16


@pytest.mark.parametrize("hint", [-5, True, 2.0])
def test_plan_refuses_a_hint_that_is_not_a_token_count(hint):
    lengths = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_tokens_hint: expected None or a non-negative int"):
        plan_decode(lengths, q_len=1, heads=4, kv_tokens_hint=hint)
    plan_decode(lengths, q_len=1, heads=4, kv_tokens_hint=np.int64(5))  # NumPy's integers are ints


@pytest.fixture
def hopper_tier_plan(monkeypatch):
    """`plan(**kwargs)`: a Hopper-tier plan (forced here on the CPU) of 40 x 8192 x 2 tokens at 128 heads on 132 SMs,
    a batch that takes equal shares where it may."""
    monkeypatch.setattr(triton_decode, "INTERPRET", False)
    monkeypatch.setattr(triton_decode.hopper_common, "serves", lambda device, kv_dtype: True)
    lengths = torch.full((40,), 8192, dtype=torch.int32)

    def plan(**kwargs):
        return plan_decode(lengths, q_len=2, heads=128, num_sms=132, **kwargs)

    return plan


def test_only_plans_for_the_seesaw_pages_may_take_equal_shares(hopper_tier_plan):
    """A Hopper-tier plan may take equal shares, and launches v96's share-only combine, only when told pages of whole
    64-token tiles (the persistent seesaw's); other page sizes, no page size or a caller's tuning keep the split
    counts (NOTES.md v98)."""
    plan = hopper_tier_plan
    for page_size in (64, 128):
        shared = plan(page_size=page_size)
        assert shared.may_share and int(shared.work_state[2]) == decode_split_plan.ORDER_SHARES, page_size
    for kwargs in ({"page_size": 16}, {"page_size": 32}, {}, {"page_size": 64, "tuning": plan(page_size=64).tuning}):
        kept = plan(**kwargs)
        assert not kept.may_share and int(kept.work_state[2]) != decode_split_plan.ORDER_SHARES, kwargs


@pytest.mark.parametrize("batch, length, q_len, ahead", [
    (64, 1024, 2, False), (40, 2048, 2, False), (32, 3072, 2, True), (64, 4096, 2, True), (40, 8192, 2, True),
    (32, 1024, 4, False)])
def test_a_hinted_plans_unit_estimate_puts_the_seesaws_choice_on_its_units_side(monkeypatch, batch, length, q_len,
                                                                                 ahead):
    """Uniform 128-head batches planned (Hopper tier forced on the CPU, 132 SMs) with their cached tokens as the hint:
    the seesaw's left half of S goes ahead where the plan's work units, read back from its work items, hold 40 KV
    tiles or more, and not where they hold 28 or fewer (40 x 2048 x 2: a plan of three waves, units of 13 tiles);
    planned without the hint, it goes ahead."""
    monkeypatch.setattr(triton_decode, "INTERPRET", False)
    monkeypatch.setattr(triton_decode.hopper_common, "serves", lambda device, kv_dtype: True)
    lengths = torch.full((batch,), length, dtype=torch.int32)
    plan = plan_decode(lengths, q_len=q_len, heads=128, num_sms=132, page_size=64, kv_tokens_hint=batch * length)
    items = plan.work.view(-1, decode_split_plan.WORK_FIELDS.value)[: int(plan.work_state[0])].tolist()
    ends = [length if end >= decode_split_plan.OPEN_KV_END.value else end for *_, end in items]
    unit_tiles = sum(-(-(end - item[5]) // 64) for item, end in zip(items, ends)) / len(items)
    assert (unit_tiles >= 40) if ahead else (unit_tiles <= 28), unit_tiles
    hint = plan.unit_tiles_hint
    assert dispatch.left_scores_ahead(plan.geometry.row_tiles, False, hint) == ahead, hint
    unhinted = plan_decode(lengths, q_len=q_len, heads=128, num_sms=132, page_size=64)
    assert unhinted.unit_tiles_hint is None
    assert dispatch.left_scores_ahead(unhinted.geometry.row_tiles, False, unhinted.unit_tiles_hint)


def test_the_unit_estimate_of_empty_and_of_split_batches():
    assert decode_split_plan.unit_tiles_hint(8 * 131072, batch=8, row_tiles=4, block_n=64, programs=132) == 497
    assert decode_split_plan.unit_tiles_hint(0, batch=0, row_tiles=1, block_n=64, programs=132) == 0
    assert decode_split_plan.unit_tiles_hint(1, batch=1, row_tiles=1, block_n=64, programs=0) == 1


def test_no_equal_shares_from_a_plan_kernel_built_by_an_unchecked_triton(hopper_tier_plan, monkeypatch):
    """A plan kernel compiled (not interpreted) by a Triton version outside SHARE_PLAN_TRITONS takes no equal shares
    (a version not checked on a GPU): the same plan as above keeps its split counts and
    launches no share-only combine; under the interpreter, or with the version listed, it takes them."""
    monkeypatch.setattr(decode_split_plan, "SHARE_PLAN_TRITONS", ("0.0.",))
    monkeypatch.setattr(decode_split_plan, "INTERPRET", True)
    assert decode_split_plan.share_plans_laid_out_right()  # the CPU interpreter lays them out
    monkeypatch.setattr(decode_split_plan, "INTERPRET", False)
    assert not decode_split_plan.share_plans_laid_out_right()
    kept = hopper_tier_plan(page_size=64)
    assert not kept.may_share and int(kept.work_state[2]) != decode_split_plan.ORDER_SHARES
    monkeypatch.setattr(decode_split_plan, "SHARE_PLAN_TRITONS", (triton.__version__,))
    shared = hopper_tier_plan(page_size=64)
    assert shared.may_share and int(shared.work_state[2]) == decode_split_plan.ORDER_SHARES


@pytest.mark.parametrize("page_size", [0, -16, True, 64.0])
def test_plan_refuses_a_page_size_that_is_not_a_positive_count(page_size):
    lengths = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="page_size: expected None or a positive int"):
        plan_decode(lengths, q_len=1, heads=4, page_size=page_size)
    plan_decode(lengths, q_len=1, heads=4, page_size=np.int32(16))
