"""Device experiment: an in-kernel timeline of the narrow fp8 decode kernel (`hopper_narrow_decode`, globaltimer
stamps): where a program's fixed part goes (prologue, first tile, loop, stores) beside its KV tiles.

Usage, from the repository root on an SM90 device:
    python benchmarks/experiments/narrow_timeline.py stamp .device/ntl
    PYTHONPATH=.device/ntl/src:benchmarks/experiments python benchmarks/experiments/narrow_timeline.py run \
        [--e4m3-scores] [--hinted] 16,64,4096,2,fp8_e4m3 ...

`stamp` copies the package and inserts, into that copy's `hopper_narrow_decode.py`, five stamps a program (start,
prologue done, first tile landed, loop end, stores issued), its KV tiles and its SM, written to an int64 buffer
(`hopper_narrow_decode.TIMELINE`) passed as one more kernel argument; it fails, naming the anchor, when the kernel's
source no longer has the text it anchors on. `run` plans each case (`--e4m3-scores`: S on 8-bit tensor cores;
`--hinted`: the plan told the batch's cached tokens), times it (CUDA-graph replay, clean L2), then runs one eager call
after an L2 flush and prints per event the min / median / max over programs (us from the first program's start), the
per-program medians of the phases, the loop's time a tile, and (where programs' KV tiles differ) a fit of a
program's own time against its tiles, and the programs' ends by how many programs of the launch their SM ran.
"""

from __future__ import annotations

from pathlib import Path

from kernel_stamps import main, stamp_functions, stamped_copy

EVENTS = ("start", "prologue", "first tile", "loop end", "stored", "tiles", "sm")
STAMPS = stamp_functions(len(EVENTS))
EDITS = {
    "hopper_narrow_decode.py": (
        ("from mlakit.kernels.launch import CachedLaunch\n",
         "from mlakit.kernels.launch import CachedLaunch\n\n# narrow_timeline.py: the stamps' int64 buffer\nTIMELINE = None\n"),
        ("kv_scale, *shared_args), constants)", "kv_scale, *shared_args, TIMELINE), constants)"),
        ("@gluon.jit(do_not_specialize=[\"stride_bt_b\"])\ndef mla_decode_hopper_narrow_fp8_kernel(",
         STAMPS + "@gluon.jit(do_not_specialize=[\"stride_bt_b\"])\ndef mla_decode_hopper_narrow_fp8_kernel("),
        ("PART_STRIDES,\n    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr,",
         "PART_STRIDES, TL,\n    HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr,"),
        ("    if idle:\n        return\n",
         "    if idle:\n        return\n    slot = gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)\n"
         "    _stamp(TL, slot, 0)\n"
         "    _record(TL, slot, 6, gl.inline_asm_elementwise(\"mov.u32 $0, %smid;\", \"=r,r\", [slot], dtype=gl.int32,\n"
         "                                                  is_pure=True, pack=1))\n"),
        ("    fence_async_shared()\n    thread_barrier()\n\n    rows = tile * ROWS",
         "    fence_async_shared()\n    thread_barrier()\n    _stamp(TL, slot, 1)\n\n    rows = tile * ROWS"),
        ("        mbarrier.wait(ready.index(stage), (t // STAGES) & 1)\n",
         "        mbarrier.wait(ready.index(stage), (t // STAGES) & 1)\n        if t == 0:\n            _stamp(TL, slot, 2)\n"),
        ("    lse, inv_l = finish_rows(m_i, l_i)\n", "    _stamp(TL, slot, 3)\n    lse, inv_l = finish_rows(m_i, l_i)\n"),
        ("    store_lse(lse, rows, LSE, PART_LSE, first_token, b, split, num_splits, q_len, LSE_STRIDES, PART_STRIDES, HEADS)\n",
         "    store_lse(lse, rows, LSE, PART_LSE, first_token, b, split, num_splits, q_len, LSE_STRIDES, PART_STRIDES, HEADS)\n"
         "    _stamp(TL, slot, 4)\n    _record(TL, slot, 5, num_tiles)\n"),
    ),
}
SLOTS = 1 << 16


def stamp(destination: Path) -> None:
    """A copy of src/ under `destination` whose narrow kernel writes the timeline's stamps."""
    stamped_copy(destination, EDITS)


def run(arguments: list[str]) -> None:
    """The timeline of each case (module docstring)."""
    import torch
    from decode_case import PLAN_FLAGS, case_plan, cases_and_plan_flags, decode_call

    from mlakit.bench.decode import DecodeCase, make_inputs, time_graph_replay
    from mlakit.kernels import hopper_narrow_decode

    if not hasattr(hopper_narrow_decode, "TIMELINE"):
        raise SystemExit("not a stamped copy: run `stamp` first and put its src/ first on PYTHONPATH")
    specs, plan_flags = cases_and_plan_flags(arguments)
    hopper_narrow_decode.TIMELINE = torch.zeros(SLOTS * len(EVENTS), dtype=torch.int64, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for spec in specs:
        case = DecodeCase.parse(spec)
        inputs = make_inputs(case, torch.device("cuda"))
        plan = case_plan(case, inputs, **plan_flags)
        if plan.geometry.row_tiles * plan.work.shape[0] > SLOTS:
            raise SystemExit(f"{spec}: {plan.geometry.row_tiles * plan.work.shape[0]} programs, more than {SLOTS} slots")
        call = decode_call(inputs, plan)
        graph_us = time_graph_replay(call, "clean-l2")
        torch.cuda.synchronize()
        hopper_narrow_decode.TIMELINE.zero_()
        flush.zero_()
        call()
        torch.cuda.synchronize()
        stamps = hopper_narrow_decode.TIMELINE.view(SLOTS, len(EVENTS)).cpu()
        # Programs with KV tiles (a split may have none: no first-tile stamp).
        stamps = stamps[(stamps[:, :5] > 0).all(1) & (stamps[:, 5] > 0)]
        if len(stamps) == 0:
            print(f"{spec}: no narrow-kernel program with KV tiles ran (another kernel took the case)")
            continue
        first = stamps[:, 0].min()
        times = (stamps[:, :5] - first).double() / 1000
        tiles = stamps[:, 5].double()
        print(f"{spec} {' '.join(a for a in PLAN_FLAGS if a in arguments)} (block_m {plan.tuning.block_m}): graph replay "
              f"{graph_us:.1f} us clean L2, programs {len(stamps)}, kernel span (stamps) {times[:, 4].max():.1f} us")
        for event, name in enumerate(EVENTS[:5]):
            column = times[:, event]
            print(f"    {name:11s} min {column.min():7.1f}  median {column.median():7.1f}  max {column.max():7.1f}")
        phases = (times[:, 1:] - times[:, :-1]).median(0).values
        # From the first tile's arrival to the loop's end the program computes every tile.
        per_tile = ((times[:, 3] - times[:, 2]) / tiles).median()
        line = (f"    medians a program: prologue {phases[0]:.1f}, to the first tile {phases[1]:.1f}, loop {phases[2]:.1f} "
                f"({per_tile:.2f} a tile), stores {phases[3]:.1f}; tiles min / median / max {int(tiles.min())} / "
                f"{int(tiles.median())} / {int(tiles.max())}")
        if tiles.unique().numel() > 1:
            own_time = times[:, 4:5] - times[:, 0:1]
            fit = torch.linalg.lstsq(torch.stack([torch.ones_like(tiles), tiles], 1), own_time).solution.flatten()
            line += f"; a program's own time = {fit[0]:.1f} + {fit[1]:.2f} x tiles"
        print(line)
        sms = stamps[:, 6]
        sharing = (sms[:, None] == sms[None, :]).sum(1)
        for count in sharing.unique().tolist():
            ends = times[sharing == count, 4]
            print(f"    programs on an SM with {count - 1} other(s): {len(ends)}, stored min / median / max "
                  f"{ends.min():.1f} / {ends.median():.1f} / {ends.max():.1f} us")

if __name__ == "__main__":
    main(__doc__, stamp, run)
