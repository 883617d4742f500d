"""CPU tool: the split plan's unit model for the Hopper seesaw (64-row tiles, one program an SM), to predict a plan
change before device time is spent (NOTES.md v87, v88, "Next (issue 23)"). Per case, the plan kernel's counts (run
under the Triton interpreter) with and without the unit cost, each plan's makespan in KV-tile times under the model
(units of a sequence's tiles / splits + the unit cost, longest first onto the least-loaded program, as the seesaw's
counter takes them) and the waves estimate the plan kernel uses; whether the plan takes equal shares with
`EQUAL_SHARES` on and their estimate (a share of the tiles + a piece's cost a round of pieces); and the even share
with no fixed cost at all; with `--pieces`, how the share plan's pieces fall on its shares.

Usage: python benchmarks/experiments/plan_model.py [--sms 132] [--unit-cost 9] [--piece-cost 7] [--pieces] CASE [...]
(CASE as `DecodeCase.parse`: HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN[,KV_DTYPE[,PAGE_SIZE]]), e.g.
    python benchmarks/experiments/plan_model.py 128,40,8192,2 128,32,~16384,2
"""

from __future__ import annotations

import heapq
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import click  # noqa: E402
import torch  # noqa: E402

from mlakit.bench.decode import DecodeCase  # noqa: E402
from mlakit.kernels import decode_split_plan  # noqa: E402
from mlakit.kernels.decode_split_plan import (OPEN_KV_END, ORDER_SHARES, SequenceSplits,  # noqa: E402
                                              decode_split_counts, split_geometry)
from mlakit.kernels.hopper_decode import BLOCK_M  # noqa: E402
from mlakit.kernels.hopper_common import BLOCK_N  # noqa: E402
from mlakit.kernels.triton_decode import BATCHED_MIN_TILES_PER_SPLIT, MIN_TILES_PER_SPLIT  # noqa: E402


def seesaw_plan(case: DecodeCase, sms: int, unit_cost: int, piece_cost: int) -> SequenceSplits:
    """The plan kernel's plan for `case` on `sms` SMs as the seesaw's (one program an SM)."""
    lengths = torch.tensor(case.lengths(), dtype=torch.int32)
    cu_seqlens_q = torch.arange(len(lengths) + 1, dtype=torch.int32) * case.q_len
    block_m, block_n = BLOCK_M.value, BLOCK_N.value
    geometry = split_geometry(len(lengths), case.heads * case.q_len, block_m, sms, programs_per_sm=1)
    return decode_split_counts(lengths, cu_seqlens_q, case.heads, geometry, block_m, block_n, sms, programs_per_sm=1,
                               min_tokens_per_split=MIN_TILES_PER_SPLIT * block_n,
                               batched_min_tokens_per_split=BATCHED_MIN_TILES_PER_SPLIT * block_n,
                               unit_cost_tiles=unit_cost, piece_cost_tiles=piece_cost, persistent=True)


def longest_first_makespan(units: list[int], programs: int) -> int:
    """Units (in tile times) taken longest first by whichever of `programs` programs is free first."""
    loads = [0] * programs
    for unit in sorted(units, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + unit)
    return max(loads)


def plan_units(tiles: list[int], counts: list[int], row_tiles: int, unit_cost: int) -> list[int]:
    """Each busy sequence's units: its row tiles x splits of cdiv(tiles, splits) tiles + the unit cost."""
    return [-(-n // s) + unit_cost for n, s in zip(tiles, counts) if n > 0 for _ in range(s * row_tiles)]


def share_pieces(plan: SequenceSplits, lengths: list[int], parts: int) -> list[list[tuple[int, int, bool]]]:
    """An equal-share plan's pieces by share, read from its rows (round k's share j in row `k x parts + j`, mirrored
    in odd rounds): (sequence, KV tiles, whether the sequence is cut) each."""
    shares: list[list[tuple[int, int, bool]]] = [[] for _ in range(parts)]
    block_n = BLOCK_N.value
    for row, (b, _, pieces, _, _, kv_start, kv_end) in enumerate(plan.work[:int(plan.work_state[0])].tolist()):
        if pieces:
            end = lengths[b] if kv_end == OPEN_KV_END.value else kv_end
            share = row % parts if row // parts % 2 == 0 else parts - 1 - row % parts
            shares[share].append((b, -(-end // block_n) - kv_start // block_n, pieces > 1))
    return shares


def pieces_summary(shares: list[list[tuple[int, int, bool]]], small: int) -> str:
    """How many shares run each number of pieces, and the cut pieces of fewer than `small` tiles."""
    by_count: dict[int, int] = {}
    for share in shares:
        by_count[len(share)] = by_count.get(len(share), 0) + 1
    tiny = sorted(tiles for share in shares for _, tiles, cut in share if cut and tiles < small)
    return (", ".join(f"{shares_with} x {count}" for count, shares_with in sorted(by_count.items()))
            + f" pieces; cut pieces under {small} tiles: {tiny or 'none'}")


def waves_estimate(units: list[int], programs: int) -> int:
    """The plan kernel's estimate: waves of programs x the longest unit."""
    return -(-len(units) // programs) * max(units)


@click.command()
@click.option("--sms", type=int, default=132, show_default=True, help="SMs (H100: 132).")
@click.option("--unit-cost", type=int, default=decode_split_plan.HOPPER_UNIT_COST_TILES, show_default=True,
              help="A unit's fixed cost in KV-tile times.")
@click.option("--piece-cost", type=int, default=decode_split_plan.HOPPER_SHARE_PIECE_COST_TILES, show_default=True,
              help="An equal share's fixed cost a piece in KV-tile times.")
@click.option("--pieces", is_flag=True,
              help="Under each share plan: shares by their number of pieces, and its short cut pieces.")
@click.argument("specs", nargs=-1, required=True)
def main(sms: int, unit_cost: int, piece_cost: int, pieces: bool, specs: tuple[str, ...]) -> None:
    print(f"{'case':<28} {'counts (cost 0 -> cost)':<26} {'makespan':>17} {'waves est.':>17} {'shares':>14} {'even':>7}")
    for spec in specs:
        case = DecodeCase.parse(spec)
        tiles = [-(-n // BLOCK_N.value) for n in case.lengths()]
        row_tiles = -(-case.heads * case.q_len // BLOCK_M.value)
        decode_split_plan.EQUAL_SHARES = False  # the split counts; the share plan below
        plans = [seesaw_plan(case, sms, cost, cost).counts.tolist() for cost in (0, unit_cost)]
        units = [plan_units(tiles, counts, row_tiles, unit_cost) for counts in plans]
        makespans = [longest_first_makespan(u, sms) for u in units]
        estimates = [waves_estimate(u, sms) for u in units]
        parts = sms // row_tiles
        decode_split_plan.EQUAL_SHARES = True
        share_plan = seesaw_plan(case, sms, unit_cost, piece_cost)
        shared = share_plan.work_state.tolist()
        rounds = shared[0] // parts
        shares = f"{-(-sum(tiles) // parts) + rounds * piece_cost} ({rounds} r.)" if shared[2] == ORDER_SHARES else "-"
        even = sum(tiles) * row_tiles / sms
        spread = "->".join(f"{min(c)}-{max(c)}" if min(c) != max(c) else str(c[0]) for c in plans)
        print(f"{case.label:<28} {spread:<26} {makespans[0]:>8} {makespans[1]:>8} {estimates[0]:>8} {estimates[1]:>8} "
              f"{shares:>14} {even:>7.1f}")
        if pieces and shared[2] == ORDER_SHARES:
            print(f"    {pieces_summary(share_pieces(share_plan, case.lengths(), parts), 2 * piece_cost)}")


if __name__ == "__main__":
    main()
