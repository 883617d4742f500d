"""CPU model of how a split plan's units spread over the SMs (issue 23, the 128-head ragged gap): the plan our decode
builds for a case (the split-count kernel under the CPU interpreter, the Hopper tier's tuning), its units taken as
the persistent seesaw takes them (unit p first for program p, then the next untaken one as each program finishes,
in the plan's order), each costing a fixed part (the first unit of a program, later units) plus a time per 64-token
tile; against an even share of all tiles per SM (FlashMLA's scheduler cuts the batch into such shares). Times are
a model, not a measurement: the per-tile and fixed costs come from measured kernel times (NOTES.md, "Ragged
schedule model").

Usage: python benchmarks/experiments/ragged_schedule_model.py [CASE] [--tile-us T] [--first-us F] [--next-us N]...
    e.g. python benchmarks/experiments/ragged_schedule_model.py 128,64,ragged,1
"""

from __future__ import annotations

import heapq
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import click  # noqa: E402
import torch  # noqa: E402

from mlakit.bench.decode import DecodeCase  # noqa: E402
from mlakit.kernels.triton_decode import default_tuning, plan_decode  # noqa: E402

SMS = 132
TILE = 64


def split_tiles(seqlen: int, split: int, splits: int) -> int:
    """Tiles of a split, as the kernels' `hopper_common.split_range` cuts a sequence (equal tile counts, the last
    shorter, splits past the end empty)."""
    per_split = -(-(-(-seqlen // TILE)) // splits)
    start = split * per_split * TILE
    end = min(seqlen, start + per_split * TILE)
    return max(-(-(end - start) // TILE), 0)


def even_share_pieces(tiles: list[int], row_tiles: int, programs: int = SMS) -> list[int]:
    """Pieces per program when each row tile's concatenated sequence tiles are cut into equal shares, one per program
    (programs split evenly between the row tiles): a program's share spans one or more sequences, and each sequence
    it touches is one piece (a split whose partial is merged as now)."""
    per_row_tile = programs // row_tiles
    total = sum(tiles)
    bounds = [0]
    for t in tiles:
        bounds.append(bounds[-1] + t)
    pieces = []
    for p in range(per_row_tile):
        lo, hi = total * p / per_row_tile, total * (p + 1) / per_row_tile
        pieces.append(sum(1 for a, b in zip(bounds, bounds[1:]) if a < hi and b > lo))
    return pieces * row_tiles


def makespan(units: list[int], tile_us: float, first_us: float, next_us: float, programs: int = SMS) -> float:
    """When the last of `programs` finishes, each taking the next untaken unit (tiles) as it finishes one."""
    ends = [(first_us + tiles * tile_us, p) for p, tiles in enumerate(units[:programs])]
    heapq.heapify(ends)
    last = 0.0
    for tiles in units[programs:]:
        free, p = heapq.heappop(ends)
        heapq.heappush(ends, (free + next_us + tiles * tile_us, p))
    while ends:
        last = max(last, heapq.heappop(ends)[0])
    return last


@click.command()
@click.argument("spec", default="128,64,ragged,1")
@click.option("--tile-us", default=1.9, show_default=True, help="Time per 64-token tile of one row tile (128h: 1.9).")
@click.option("--first-us", "first_list", default="15.5", show_default=True,
              help="Comma-separated fixed costs of a program's first unit (128h 64x1024/64x4096 fit: 15.5).")
@click.option("--next-us", "next_list", default="3,5,10", show_default=True,
              help="Comma-separated fixed costs of each later unit (prologue, first S, stores: 3-10).")
def main(spec: str, tile_us: float, first_list: str, next_list: str) -> None:
    case = DecodeCase.parse(spec)
    lengths = case.lengths()
    rows = case.heads * case.q_len
    plan = plan_decode(torch.tensor(lengths, dtype=torch.int32), q_len=case.q_len, heads=case.heads,
                       kv_dtype=torch.bfloat16, num_sms=SMS,
                       tuning=default_tuning(rows, hopper_tier=True, kv_dtype=torch.bfloat16))
    items = plan.work[: int(plan.work_state[0])].tolist()
    row_tiles = plan.geometry.row_tiles
    units = [split_tiles(lengths[seq], split, splits) for seq, split, splits, *_ in items for _ in range(row_tiles)]
    print(f"{case.label}: {len(lengths)} sequences, {sum(lengths)} tokens; plan ceiling {plan.geometry.max_splits}, "
          f"{len(items)} items x {row_tiles} row tiles = {len(units)} units, {sum(units)} tiles, largest "
          f"{max(units)}")
    pieces = even_share_pieces([-(-n // TILE) for n in lengths], row_tiles)
    print(f"even shares: {sum(units) / SMS:.1f} tiles per program in {min(pieces)}-{max(pieces)} pieces "
          f"(mean {sum(pieces) / len(pieces):.2f})")
    for first_us in map(float, first_list.split(",")):
        share = first_us + sum(units) * tile_us / SMS
        for next_us in map(float, next_list.split(",")):
            ours = makespan(units, tile_us, first_us, next_us)
            shared = share + (max(pieces) - 1) * next_us
            print(f"fixed {first_us:.1f} / {next_us:.1f} us: our plan {ours:6.1f} us, an even share {share:6.1f} us "
                  f"(ours {ours / share:.3f}x), even shares paying each piece's fixed part {shared:6.1f} us")


if __name__ == "__main__":
    main()
