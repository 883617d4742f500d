"""Equal-share split plans (`decode_share_plan`, built by the split-plan kernel): their items against a model of the
layout, where the plan takes them, and a decode over one against the float64 oracle (CPU interpreter)."""

import dataclasses

import pytest
import torch
from fuzz_outcomes import FUZZ
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlakit.kernels import decode_split_plan
from mlakit.kernels.decode_split_plan import (OPEN_KV_END, ORDER_SHARES, ORDER_TAKEN, SplitGeometry,
                                              decode_split_counts, split_geometry)
from mlakit.kernels.triton_decode import DecodeTuning, plan_decode, triton_mla_decode
from paged_inputs import assert_lse_close, make_paged_batch, naive_decode, relative_error

BLOCK_N = 64


# Whether this Triton's plan kernel lays share plans out right, read before `equal_shares` lifts the guard.
LAID_OUT_RIGHT = decode_split_plan.share_plans_laid_out_right()


@pytest.fixture(autouse=True)
def equal_shares(monkeypatch):
    """Shares on, from any Triton's plan kernel: these tests check its layout, also where
    `decode_split_plan.SHARE_PLAN_TRITONS` keeps a GPU build's shares out."""
    monkeypatch.setattr(decode_split_plan, "EQUAL_SHARES", True)
    monkeypatch.setattr(decode_split_plan, "SHARE_PLAN_TRITONS", ("",))


def _plan(device: str, lengths: list[int], q_lens: list[int], heads: int = 128, num_sms: int = 132,
          unit_cost: int = 13, piece_cost: int | None = None, block_m: int = 64, block_n: int = BLOCK_N,
          persistent: bool = True):
    """The split plan's geometry, counts, items and work state for one program an SM (the seesaw's plan; a grid
    kernel's with `persistent` False)."""
    cu_seqlens_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    geometry = split_geometry(len(lengths), heads * max(q_lens), block_m, num_sms, programs_per_sm=1)
    counts, work, state = decode_split_counts(
        torch.tensor(lengths, dtype=torch.int32, device=device), cu_seqlens_q, heads, geometry, block_m, block_n,
        num_sms, programs_per_sm=1, min_tokens_per_split=2 * block_n, batched_min_tokens_per_split=4 * block_n,
        unit_cost_tiles=unit_cost, piece_cost_tiles=piece_cost, persistent=persistent)
    return geometry, counts.cpu(), work.cpu(), state.cpu()


def _expected_pieces(tiles: list[int], parts: int) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """The layout's model: (sequence, piece) -> (row, first tile, end tile, pieces of the sequence). The tiles laid
    end to end and cut at `j x total // parts`; a part's pieces in batch order but the one cut at the part's end
    first; round k's part j in row `k x parts + j`, parts mirrored in odd rounds."""
    total = sum(tiles)
    bounds = [j * total // parts for j in range(parts + 1)]
    by_part: list[list[tuple[int, int, int, int, bool]]] = [[] for _ in range(parts)]
    pieces = [0] * len(tiles)
    start = 0
    for b, n in enumerate(tiles):
        for j in range(parts):
            lo, hi = max(start, bounds[j]), min(start + n, bounds[j + 1])
            if lo < hi:
                by_part[j].append((b, pieces[b], lo - start, hi - start, hi < start + n))
                pieces[b] += 1
        start += n
    expected = {}
    for j, part in enumerate(by_part):
        if part and part[-1][4]:
            part = [part[-1], *part[:-1]]
        for k, (b, piece, lo, hi, _) in enumerate(part):
            expected[b, piece] = (k * parts + (j if k % 2 == 0 else parts - 1 - j), lo, hi, pieces[b])
    return expected


def _uneven(sequences: int, length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return (length * (1 + 0.2 * (2 * torch.rand(sequences, generator=gen) - 1))).int().tolist()


def _ragged(sequences: int, seed: int) -> list[int]:
    """Lengths of 400-16000 tokens, as the benchmark's ragged batch."""
    return torch.randint(400, 16001, (sequences,), generator=torch.Generator().manual_seed(seed)).tolist()


def _assert_share_layout(lengths: list[int], q_len: int, geometry: SplitGeometry, counts: torch.Tensor,
                         work: torch.Tensor, state: torch.Tensor, num_sms: int) -> None:
    """A share plan's rows, counts and work state are the layout model's; every other row is zero; the persistent
    kernel's snake order over `num_sms` programs keeps each program on one share, round after round."""
    parts = num_sms // geometry.row_tiles
    tiles = [-(-n // BLOCK_N) for n in lengths]
    expected = _expected_pieces(tiles, parts)
    rounds = 1 + max(row for row, *_ in expected.values()) // parts
    assert state.tolist() == [rounds * parts, 0, ORDER_SHARES]
    seen = torch.zeros(work.shape[0], dtype=torch.bool)
    for (b, piece), (row, lo, hi, pieces) in expected.items():
        end = OPEN_KV_END.value if piece == pieces - 1 else hi * BLOCK_N
        assert work[row].tolist() == [b, piece, pieces, b * q_len, q_len, lo * BLOCK_N, end], (b, piece)
        seen[row] = True
    assert counts.tolist() == [max(p for (s, p) in expected if s == b) + 1 for b in range(len(lengths))]
    assert (work[~seen] == 0).all(), "rows without a piece name no split"
    assert max(counts) <= geometry.max_splits
    # The share of a row's piece is where the piece's first tile lies in the batch.
    first_tiles = [sum(tiles[:b]) for b in range(len(tiles))]
    bounds = [j * sum(tiles) // parts for j in range(parts)]
    for program in range(num_sms):
        units = [k * num_sms + (program if k % 2 == 0 else num_sms - 1 - program) for k in range(rounds)]
        rows = [int(unit) // geometry.row_tiles for unit in units if seen[int(unit) // geometry.row_tiles]]
        starts = [first_tiles[int(work[row, 0])] + int(work[row, 5]) // BLOCK_N for row in rows]
        assert {max(j for j, bound in enumerate(bounds) if bound <= start) for start in starts} == {
            program // geometry.row_tiles}, program


@pytest.mark.parametrize("lengths, q_len", [
    ([8192] * 40, 2),
    ([16384] * 24, 1),
    (_uneven(32, 16384, 1), 2),
    (_uneven(10, 8192, 2), 2),
    (_ragged(64, 3), 1),  # several short sequences in a share: rounds past the split counts' rows
    (_ragged(64, 4), 2),
])
def test_share_plan_items_follow_the_layout(kernel_device, lengths, q_len, request):
    """Every sequence's pieces cover its tiles once, in order, the last one open-ended; the rows, the counts and
    the work state as the layout's model gives them; every other row zero. (Before v101 Triton 3.7.1's GPU build
    counted the items of plans of two rounds or more short; a build of a version not checked may fail.)"""
    if kernel_device == "cuda" and not LAID_OUT_RIGHT:
        request.applymarker(pytest.mark.xfail(reason="a Triton whose GPU plan kernel was not checked"))
    num_sms = 132 if len(lengths) > 10 else 32
    geometry, counts, work, state = _plan(kernel_device, lengths, [q_len] * len(lengths), num_sms=num_sms)
    assert int(state[2]) == ORDER_SHARES, "the batch takes equal shares"
    _assert_share_layout(lengths, q_len, geometry, counts, work, state, num_sms)


@settings(FUZZ, max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tiles=st.lists(st.integers(1, 40), min_size=1, max_size=20), parts=st.integers(1, 12))
def test_share_layouts_of_random_batches_follow_the_model(kernel_device, tiles, parts):
    """Small random batches at 128 heads x 1 token (two row tiles a sequence) over 1-12 shares: boundaries at a
    sequence's first tile or inside it, one-tile sequences, a share holding several sequences. Where the plan takes
    shares (a unit cost past any batch's makes the split counts lose), its rows are the layout model's."""
    if kernel_device == "cuda" and not LAID_OUT_RIGHT:
        pytest.xfail("a Triton whose GPU plan kernel was not checked")
    lengths = [n * BLOCK_N for n in tiles]
    geometry, counts, work, state = _plan(kernel_device, lengths, [1] * len(lengths), num_sms=2 * parts,
                                          unit_cost=1 << 20, piece_cost=0)
    assume(int(state[2]) == ORDER_SHARES)
    _assert_share_layout(lengths, 1, geometry, counts, work, state, 2 * parts)


def test_share_plans_are_taken_where_their_estimate_is_a_sixteenth_shorter(kernel_device, monkeypatch):
    """On 132 SMs at 128 heads (a share of the tiles plus 13 tiles a piece a part runs, against the split counts'
    makespan): 40 x 8192 x 2 tokens (155 + 3 x 13 against 231), 24 x 16384 at one and two tokens and uneven 32 x
    ~16384 take shares; 64 x ~4096 (126 + 4 x 13 against 180), 64 x 16384 and 128 x 4096 keep their split counts,
    as do batches that are ragged with pieces past the split ceiling, hold an empty sequence or mixed query lengths,
    plans without a unit cost or for a grid kernel (not `persistent`), and a GPU whose SMs are not whole groups of a
    sequence's row tiles; so does every batch with EQUAL_SHARES off."""
    def order(lengths: list[int], q_len: int | list[int], **kwargs) -> int:
        q_lens = q_len if isinstance(q_len, list) else [q_len] * len(lengths)
        return int(_plan(kernel_device, lengths, q_lens, **kwargs)[3][2])

    shares = [([8192] * 40, 2), ([16384] * 24, 2), ([16384] * 24, 1), (_uneven(32, 16384, 1), 2)]
    for lengths, q_len in shares:
        assert order(lengths, q_len) == ORDER_SHARES, (len(lengths), q_len)
    for lengths, q_len in [(_uneven(64, 4096, 3), 2), ([16384] * 64, 2), ([4096] * 128, 2),
                           ([65536] + [4096] * 23, 2), ([16384] * 24 + [0], 2), ([16384] * 24, [2] * 23 + [1])]:
        assert order(lengths, q_len) != ORDER_SHARES, (len(lengths), q_len)
    assert order([8192] * 40, 2, unit_cost=0) != ORDER_SHARES
    assert order([8192] * 40, 2, persistent=False) != ORDER_SHARES  # a grid kernel's plan
    assert order([8192] * 40, 2, num_sms=130) != ORDER_SHARES  # 130 programs are not whole groups of 4 row tiles
    monkeypatch.setattr(decode_split_plan, "EQUAL_SHARES", False)
    for lengths, q_len in shares:
        assert order(lengths, q_len) != ORDER_SHARES


def test_the_default_costs_keep_the_measured_share_plans(kernel_device):
    """With HOPPER_UNIT_COST_TILES and HOPPER_SHARE_PIECE_COST_TILES as set (NOTES.md v99, v100) on 132 SMs at 128
    heads: the part-filled waves the H200's A/Bs measured faster with shares take them (24 x 8192 x 1, 48 x 4096 x 1,
    40 x 2048 x 1, 24 x 4096 x 2; since v100 96 x 2048 x 1, 48 x 4096 x 2, 48 x 2048 x 2, 80 x 1024 x 1, 40 x 1024 x
    2), the batches that took shares at 13 tiles keep them (24 x 16384 x 2, 48 x 16384 x 1, 40 x 8192 x 2), and full
    waves and the batches that lost with shares at lower piece costs keep their split counts (64 x 4096 x 2, 128 x
    4096 x 1, 40 x 1024 x 1, 48 x 1024 x 1)."""
    def order(sequences: int, tokens: int, q_len: int) -> int:
        return int(_plan(kernel_device, [tokens] * sequences, [q_len] * sequences,
                         unit_cost=decode_split_plan.HOPPER_UNIT_COST_TILES,
                         piece_cost=decode_split_plan.HOPPER_SHARE_PIECE_COST_TILES)[3][2])

    for batch in [(24, 8192, 1), (48, 4096, 1), (40, 2048, 1), (24, 4096, 2), (24, 16384, 2), (48, 16384, 1),
                  (40, 8192, 2), (96, 2048, 1), (48, 4096, 2), (48, 2048, 2), (80, 1024, 1), (40, 1024, 2)]:
        assert order(*batch) == ORDER_SHARES, batch
    for batch in [(64, 4096, 2), (128, 4096, 1), (40, 1024, 1), (48, 1024, 1)]:
        assert order(*batch) != ORDER_SHARES, batch


def test_ragged_batches_take_equal_shares_at_two_row_tiles_or_more(kernel_device, monkeypatch):
    """With RAGGED_EQUAL_SHARES a ragged batch at 128 heads takes equal shares at one and two tokens (two and four row
    tiles), in twice the split counts' rows (the host enlarges them wherever a plan may take shares); at 16 heads (one
    row tile), without a unit cost, for a grid kernel (not `persistent`) or with the setting off it keeps its split
    counts, taken as programs finish, in the split counts' rows; with an empty sequence too, in the enlarged rows."""
    def plan(lengths: list[int], q_len: int, heads: int = 128, unit_cost: int = 13,
             persistent: bool = True) -> tuple[int, int, int]:
        geometry, _, work, state = _plan(kernel_device, lengths, [q_len] * len(lengths), heads=heads,
                                         unit_cost=unit_cost, persistent=persistent)
        return int(state[2]), work.shape[0], len(lengths) * geometry.max_splits

    lengths = _ragged(64, 5)
    for q_len in (1, 2):
        order, rows, capacity = plan(lengths, q_len)
        assert order == ORDER_SHARES and rows == decode_split_plan.RAGGED_SHARE_ROWS * capacity, q_len
    for order, rows, capacity in [plan(lengths, 1, heads=16), plan(lengths, 1, unit_cost=0),
                                  plan(lengths, 1, persistent=False)]:
        assert order == ORDER_TAKEN and rows == capacity
    order, rows, capacity = plan(lengths[:-1] + [0], 1)
    assert order == ORDER_TAKEN and rows == decode_split_plan.RAGGED_SHARE_ROWS * capacity
    monkeypatch.setattr(decode_split_plan, "RAGGED_EQUAL_SHARES", False)
    order, rows, capacity = plan(lengths, 1)
    assert order == ORDER_TAKEN and rows == capacity


@pytest.mark.parametrize("kv_dtype, seed", [("bf16", 0), ("fp8_e4m3", 1)])
def test_decode_over_a_share_plan_matches_the_oracle(kernel_device, kv_dtype, seed):
    """16 heads x 2 tokens in 16-row tiles (two row tiles a sequence), 8 programs: five sequences of 20-26 KV tiles
    of 32 tokens cut into four shares, run by the portable kernel, against the float64 oracle (pages in random
    order, garbage in the unused ones)."""
    lengths = [700 + 37 * i for i in range(4)] + [641]
    batch = make_paged_batch(lengths, heads=16, q_len=2, page_size=16, kv_dtype=kv_dtype, seed=seed,
                             device=kernel_device)
    tuning = DecodeTuning(16, 32, 4, programs_per_sm=1)
    plan = plan_decode(batch.cache_seqlens, q_len=2, heads=16, kv_dtype=batch.kv_cache.dtype, tuning=tuning,
                       num_sms=8)
    cu_seqlens_q = torch.arange(0, 2 * len(lengths) + 1, 2, dtype=torch.int32, device=kernel_device)
    counts, work, state = decode_split_counts(batch.cache_seqlens, cu_seqlens_q, 16, plan.geometry, 16, 32, 8,
                                              programs_per_sm=1, unit_cost_tiles=2, persistent=True)
    assert int(state[2]) == ORDER_SHARES and int(counts.max()) > 1
    assert plan.geometry == SplitGeometry(row_tiles=2, max_splits=3)
    plan = dataclasses.replace(plan, num_splits=counts, work=work, work_state=state)
    out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                 kv_lora_rank=batch.kv_lora_rank, softmax_scale=batch.softmax_scale,
                                 kv_scale=batch.kv_scale, plan=plan)
    expected_out, expected_lse = naive_decode(batch)
    assert relative_error(out, expected_out) < 3e-2
    assert_lse_close(lse, expected_lse, atol=3e-2)
