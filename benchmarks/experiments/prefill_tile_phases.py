"""Device experiment: where a warpgroup's time goes per key tile in the persistent Hopper prefill (SM clock stamps).

Usage, from the repository root on an SM90 device:
    python benchmarks/experiments/prefill_tile_phases.py stamp .device/ptp      # a stamped copy of src/ there
    PYTHONPATH=.device/ptp/src:tests python benchmarks/experiments/prefill_tile_phases.py run 128,1,8192,0 --fp8

`stamp` makes `prefill_timeline.py`'s stamped copy (its unit stamps and the timeline buffer's plumbing) and adds,
in `_attend_rows`, four `%clock64` stamps per computed tile and warpgroup for each program's first TILE_SLOTS
tiles: turn taken, MMAs issued (the turn handed over), MMAs done (the wait), softmax done. The stores are
predicated, not branched (a branch between an MMA's issue and its wait makes ptxas wait at the branch).
`run` calls each case once after an L2 flush and prints, per warpgroup, the median cycles of each phase over the
programs' tiles past their first two, and the tile period (turn to next turn): what the tensor cores' and the
softmax's shares of a tile are, measured.
"""

from __future__ import annotations

from pathlib import Path

import prefill_timeline
from kernel_stamps import main, stamped_copy

TILE_SLOTS = 64
TILE_EVENTS = ("turn", "issued", "mma done", "softmax done")
TILE_STAMP = f'''TILE_SLOTS = gl.constexpr({TILE_SLOTS})


@gluon.jit
def _tile_stamp(TL, slot, tile, HALF: gl.constexpr, event: gl.constexpr):
    t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [slot], dtype=gl.int64, is_pure=False, pack=1)
    base = gl.num_programs(0) * TIMELINE_UNITS * {len(prefill_timeline.EVENTS)}
    offset = ((gl.program_id(0) * TILE_SLOTS + gl.minimum(tile, TILE_SLOTS - 1)) * 2 + HALF) * {len(TILE_EVENTS)}
    gl.store(TL + base + offset + event, t, mask=(slot >= 0) & (tile < TILE_SLOTS))


'''
STAMP = "        _tile_stamp(TL, slot, first_tile + t, HALF, {event})\n"
# Applied after prefill_timeline's edits; each anchor must occur once in their result.
EDITS = (
    ("@gluon.jit\ndef _load_q(", TILE_STAMP + "@gluon.jit\ndef _load_q("),
    ("        if t == 0:\n            _stamp(TL, slot, 2 + HALF)\n",
     "        if t == 0:\n            _stamp(TL, slot, 2 + HALF)\n" + STAMP.format(event=0)),
    ("                    sums_mma = _row_sums(ones, p_op)\n                    hand_over(their_turn)\n",
     "                    sums_mma = _row_sums(ones, p_op)\n                    hand_over(their_turn)\n"
     + "            " + STAMP.format(event=1)),
    ("                    l_i += _row_sums_done(sums, rows_layout)\n                else:\n"
     "                    hand_over(their_turn)\n",
     "                    l_i += _row_sums_done(sums, rows_layout)\n                else:\n"
     "                    hand_over(their_turn)\n" + "            " + STAMP.format(event=1)),
    ("                    s, acc, sums = warpgroup_mma_wait(num_outstanding=0, deps=[s_mma, acc_mma, sums_mma])\n",
     "                    s, acc, sums = warpgroup_mma_wait(num_outstanding=0, deps=[s_mma, acc_mma, sums_mma])\n"
     + "            " + STAMP.format(event=2)),
    ("                    s, acc = warpgroup_mma_wait(num_outstanding=0, deps=[s_mma, acc_mma])\n",
     "                    s, acc = warpgroup_mma_wait(num_outstanding=0, deps=[s_mma, acc_mma])\n"
     + "            " + STAMP.format(event=2)),
    ("            p = _p_carried(p_tile, q_nope_smem.dtype, p_layout)\n    _stamp(TL, slot, 4 + HALF)\n",
     "            p = _p_carried(p_tile, q_nope_smem.dtype, p_layout)\n    " + STAMP.format(event=3)
     + "    _stamp(TL, slot, 4 + HALF)\n"),
)


def stamp(destination: Path) -> None:
    """prefill_timeline's stamped copy under `destination`, with the per-tile stamps added."""
    target = stamped_copy(destination, {"hopper_prefill.py": prefill_timeline.EDITS + EDITS})
    print(f"per-tile stamps in {target}")


def run(arguments: list[str]) -> None:
    """The per-tile phases of each case (module docstring); `--fp8` runs the e4m3 kernel on rounded operands."""
    import torch

    from mlakit.bench.prefill import PrefillCase, _fp8_kernel, _triton_kernel, make_attention_inputs
    from mlakit.kernels import hopper_prefill

    if not hasattr(hopper_prefill, "TILE_SLOTS"):
        raise SystemExit("not a stamped copy: run `stamp` first and put its src/ first on PYTHONPATH")
    fp8 = "--fp8" in arguments
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    unit_area = sms * prefill_timeline.UNITS * len(prefill_timeline.EVENTS)
    events = len(TILE_EVENTS)
    hopper_prefill.TIMELINE = torch.zeros(unit_area + sms * TILE_SLOTS * 2 * events, dtype=torch.int64, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    factory = _fp8_kernel(quantize_in_call=False) if fp8 else _triton_kernel(None)
    for spec in (a for a in arguments if a != "--fp8"):
        call = factory(make_attention_inputs(PrefillCase.parse(spec), torch.device("cuda")))
        call()
        hopper_prefill.TIMELINE.zero_()
        flush.zero_()
        call()
        torch.cuda.synchronize()
        stamps = hopper_prefill.TIMELINE[unit_area:].view(sms, TILE_SLOTS, 2, events).cpu().double()
        print(f"{spec} {'fp8' if fp8 else 'bf16'}: cycles per tile, median over programs and tiles 2..{TILE_SLOTS - 2}")
        for half in (0, 1):
            tiles = stamps[:, 2:TILE_SLOTS - 1, half]
            following = stamps[:, 3:TILE_SLOTS, half]
            done = (tiles > 0).all(-1) & (following[..., 0] > 0)
            spans = {
                "issue (turn to hand-over)": tiles[..., 1] - tiles[..., 0],
                "MMAs (hand-over to wait done)": tiles[..., 2] - tiles[..., 1],
                "softmax (wait done to P)": tiles[..., 3] - tiles[..., 2],
                "to the next turn": following[..., 0] - tiles[..., 3],
                "period (turn to next turn)": following[..., 0] - tiles[..., 0],
            }
            print(f"  warpgroup {half}: {int(done.sum())} tiles")
            for name, span in spans.items():
                values = span[done]
                if values.numel():
                    print(f"    {name:32s} {values.median():8.0f}  (p10 {values.quantile(0.1):7.0f}, "
                          f"p90 {values.quantile(0.9):7.0f})")
        _print_joint(stamps[sms // 2])


def _print_joint(program, first: int = 10, tiles: int = 3) -> None:
    """One program's tiles `first` .. + `tiles` on one axis (cycles from its first warpgroup's turn there): both
    warpgroups' four events a tile, in time order, to see which phases of the two overlap."""
    origin = program[first, 0, 0]
    events = sorted((float(program[tile, half, event] - origin), tile, half, name)
                    for tile in range(first, first + tiles) for half in (0, 1)
                    for event, name in enumerate(TILE_EVENTS) if program[tile, half, event] > 0)
    print("  one program, both warpgroups on one axis: " + ", ".join(
        f"{cycles:.0f} t{tile} wg{half} {name}" for cycles, tile, half, name in events))


if __name__ == "__main__":
    main(__doc__, stamp, run)
