"""Device experiment (v79, NOTES.md): the persistent seesaw over an equal-share plan built on the host, against the
default plan (interleaved in one process, clean L2), on a source tree with `patches/v79-seesaw-share-plan-ranges.diff`
applied (plan rows carry each piece's tile range; the seesaw reads them and walks a share plan in lockstep when
`WORK_STATE[2] == 2`: program p takes row tile p % R of its part p // R's pieces, parts = programs // R). 128-head
cases only: the 16-head narrow kernel does not read the ranges.

The share plan: the batch's KV tiles laid end to end and cut into `parts` equal shares, each sequence cut at the
share boundaries inside it (a piece per share it meets); a part walks its pieces in batch order, except that a
piece cut at the part's end goes first, so both pieces of a cut sequence run early and its merge (in the kernel, by
whichever of its programs finishes last) comes early. Prints each case's share plan, the largest difference between
its outputs and lse and the default plan's, and the times; a third variant leaves the share plan's merges to the combine kernel (its split
ceiling above `MERGE_MAX_SPLITS`).

Usage: PYTHONPATH=build/dev/shares/src:benchmarks/experiments python benchmarks/experiments/share_plan_probe.py \
    128,64,16384,2 128,64,ragged,1 ...
"""

from __future__ import annotations

import bisect
import dataclasses
import sys
from collections.abc import Callable

import torch
from decode_case import case_inputs, case_plan, decode_call, interleaved_times

from mlakit.bench.decode import DecodeCase
from mlakit.device import sm_count
from mlakit.kernels.decode_split_plan import OPEN_END_TILE, WORK_FIELDS, SplitGeometry
from mlakit.kernels.hopper_decode.dispatch import MERGE_MAX_SPLITS
from mlakit.kernels.hopper_common import BLOCK_N
from mlakit.kernels.triton_decode import DecodePlan

assert WORK_FIELDS == 7, "run on a tree with patches/v79-seesaw-share-plan-ranges.diff applied (PYTHONPATH first)"
FIELDS = int(WORK_FIELDS)


def share_items(tiles: list[int], q_len: int, row_tiles: int,
                programs: int) -> tuple[list[list[int]], list[int], int]:
    """The share plan's rows for sequences of `tiles` KV tiles and `q_len` query tokens each (round-major: row
    k x parts + j holds part j's k-th piece; rows past a part's pieces all zeros, which no program runs), the pieces
    per sequence and the number of parts."""
    parts = programs // row_tiles
    total = sum(tiles)
    bounds = [j * total // parts for j in range(parts + 1)]
    by_part: list[list[tuple[int, int, int, int, bool]]] = [[] for _ in range(parts)]
    pieces = [0] * len(tiles)
    start = 0
    for b, n in enumerate(tiles):
        end = start + n
        for j in range(min(bisect.bisect_right(bounds, start) - 1, parts - 1), parts):
            lo, hi = max(start, bounds[j]), min(end, bounds[j + 1])
            if lo < hi or n == 0:  # a sequence without tiles still gets a piece (its rows' empty result)
                by_part[j].append((b, pieces[b], lo - start, hi - start, hi < end))
                pieces[b] += 1
            if bounds[j + 1] >= end:
                break
        start = end
    rounds = max(len(part) for part in by_part)
    items = [[0] * FIELDS for _ in range(rounds * parts)]
    for j, part in enumerate(by_part):
        if part and part[-1][4]:
            part = [part[-1]] + part[:-1]
        for k, (b, i, lo, hi, _) in enumerate(part):
            items[k * parts + j] = [b, i, pieces[b], b * q_len, q_len, lo, int(OPEN_END_TILE) if i == pieces[b] - 1 else hi]
    return items, pieces, parts


def share_plan(plan: DecodePlan, seqlens: list[int], q_len: int, row_tiles: int, programs: int,
               min_ceiling: int = 2) -> tuple[DecodePlan, str]:
    """`plan` with its work items, work state (lockstep mode), split counts and ceiling replaced by the share plan's,
    and a line describing it. A ceiling (`min_ceiling` at least) above `dispatch.MERGE_MAX_SPLITS` leaves the merges
    to the combine kernel."""
    tiles = [-(-n // int(BLOCK_N)) for n in seqlens]
    items, pieces, parts = share_items(tiles, q_len, row_tiles, programs)
    device = plan.work.device
    work = torch.tensor(items, dtype=torch.int32, device=device)
    state = torch.tensor([len(items), 0, 2], dtype=torch.int32, device=device)
    geometry = SplitGeometry(row_tiles, max(min_ceiling, max(pieces)))
    summary = (f"{parts} parts, {len(items) // parts} rounds, pieces per sequence {min(pieces)}-{max(pieces)}, "
               f"{sum(p > 1 for p in pieces)} cut, share {sum(tiles) / parts:.1f} tiles")
    return dataclasses.replace(plan, geometry=geometry, work=work, work_state=state,
                               num_splits=torch.tensor(pieces, dtype=torch.int32, device=device)), summary


def main(cases: list[str]) -> None:
    """Each case's share plans (merged in the kernel, by the combine) checked against its default plan, then the three
    timed."""
    calls: dict[tuple[str, str], Callable] = {}
    for spec in cases:
        case = DecodeCase.parse(spec)
        inputs, plan = case_inputs(case)
        shared, summary = share_plan(case_plan(case, inputs), inputs.cache_seqlens.tolist(), case.q_len,
                                     plan.geometry.row_tiles, sm_count(inputs.q.device))
        default_out, default_lse = decode_call(inputs, plan)()
        share_out, share_lse = decode_call(inputs, shared)()
        out_diff = (default_out.float() - share_out.float()).abs().max().item()
        lse_diff = (default_lse - share_lse).abs().max().item()
        print(f"{spec}: default units {int(plan.work_state[0]) * plan.geometry.row_tiles} (splits "
              f"{int(plan.num_splits.min())}-{int(plan.num_splits.max())}); shares: {summary}; max |out diff| {out_diff:.2e}, "
              f"|lse diff| {lse_diff:.2e}", flush=True)
        combined, _ = share_plan(case_plan(case, inputs), inputs.cache_seqlens.tolist(), case.q_len,
                                 plan.geometry.row_tiles, sm_count(inputs.q.device), MERGE_MAX_SPLITS + 1)
        combine_out, _ = decode_call(inputs, combined)()
        print(f"{spec}: shares merged by the combine, max |out diff| "
              f"{(default_out.float() - combine_out.float()).abs().max().item():.2e}", flush=True)
        calls[spec, "default"] = decode_call(inputs, plan)
        calls[spec, "shares"] = decode_call(inputs, shared)
        calls[spec, "shares+combine"] = decode_call(inputs, combined)
    times = interleaved_times(["default", "shares", "shares+combine"], cases, lambda variant, spec: calls[spec, variant], rounds=3,
                              timing="clean-l2")
    for spec in cases:
        base, share, combine = (min(times[spec, variant]) for variant in ("default", "shares", "shares+combine"))
        print(f"{spec:<20} default {base:8.1f} us | shares {share:8.1f} us ({share / base:.3f}) | shares+combine "
              f"{combine:8.1f} us ({combine / base:.3f})  all: {[round(t, 1) for t in times[spec, 'default']]} "
              f"{[round(t, 1) for t in times[spec, 'shares']]} {[round(t, 1) for t in times[spec, 'shares+combine']]}")


if __name__ == "__main__":
    main(sys.argv[1:])
