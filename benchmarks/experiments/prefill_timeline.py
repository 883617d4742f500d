"""Device experiment: an in-kernel timeline of the persistent Hopper prefill (globaltimer stamps per unit).

Usage, from the repository root on an SM90 device:
    python benchmarks/experiments/prefill_timeline.py stamp .device/ptl      # a stamped copy of src/ there
    PYTHONPATH=.device/ptl/src:tests python benchmarks/experiments/prefill_timeline.py run 128,64,512,0 128,8,2048,0

`stamp` copies the package and inserts, into that copy's `hopper_prefill.py`, stamps of every unit a program runs
(its first UNITS; later ones overwrite the last slot): each consumer warpgroup's unit read, first turn taken, tile
loop end and rows stored, the producer's publish, Q load issued (after its buffer came back) and last tile
issued, and the unit's tile count; into an int64 buffer passed as one more argument of the persistent kernel.
It fails, naming the anchor, when the kernel's source no longer has the text it anchors on: update the anchors.
`run` times each case (`bench prefill`'s median), then runs one call after an L2 flush and prints the medians
over the programs' middle units (the first and last two left out) of each phase, per tile count.
"""

from __future__ import annotations

from pathlib import Path

from kernel_stamps import main, stamp_functions, stamped_copy

UNITS = 512
EVENTS = ("read wg0", "read wg1", "turn wg0", "turn wg1", "loop end wg0", "loop end wg1", "stored wg0", "stored wg1",
          "published", "Q issued", "tiles", "tiles issued")
HEADER = (f"TIMELINE = None  # prefill_timeline.py: an int64 [programs * {UNITS} * {len(EVENTS)}] tensor of stamps\n"
          f"TIMELINE_UNITS = gl.constexpr({UNITS})\n\n\n" + stamp_functions(len(EVENTS)))
SLOT = "gl.program_id(0) * TIMELINE_UNITS + gl.minimum({count}, TIMELINE_UNITS - 1)"
# (anchor, replacement) pairs applied in order to hopper_prefill.py; each anchor must occur exactly once.
EDITS = (
    ("@gluon.jit\ndef _load_q(", HEADER + "@gluon.jit\ndef _load_q("),
    ("q_phase, q_buffer, scale_log2, q_free, k_read,\n", "q_phase, q_buffer, scale_log2, q_free, k_read, TL, slot,\n"),
    ("num_tiles, 0, 0, 0, scale_log2, q_ready.index(0),\n                                 q_ready.index(0), HALF,",
     "num_tiles, 0, 0, 0, scale_log2, q_ready.index(0),\n                                 q_ready.index(0), LSE, -1, HALF,"),
    ("        take_over(my_turn)\n        s = s_zero\n",
     "        take_over(my_turn)\n        if t == 0:\n            _stamp(TL, slot, 2 + HALF)\n        s = s_zero\n"),
    ("            p = _p_carried(p_tile, q_nope_smem.dtype, p_layout)\n",
     "            p = _p_carried(p_tile, q_nope_smem.dtype, p_layout)\n    _stamp(TL, slot, 4 + HALF)\n"),
    ("                         stride_o_head, stride_lse_tok,\n                         HALF: gl.constexpr,",
     "                         stride_o_head, stride_lse_tok, TL,\n                         HALF: gl.constexpr,"),
    ("        q_buffer = done % Q_BUFFERS\n",
     "        q_buffer = done % Q_BUFFERS\n        slot = " + SLOT.format(count="done") + "\n"
     "        _stamp(TL, slot, HALF)\n"),
    ("q_free.index(q_buffer), k_read,\n                                     HALF,", "q_free.index(q_buffer), k_read, TL, slot,\n                                     HALF,"),
    ("STAGE_IN_Q, not keeps_last_k)\n", "STAGE_IN_Q, not keeps_last_k)\n        _stamp(TL, slot, 6 + HALF)\n"),
    ("                         stride_v_head, NOPE_DIM: gl.constexpr,",
     "                         stride_v_head, TL, NOPE_DIM: gl.constexpr,"),
    ("            _publish_unit(unit_smem, unit_ready, unit_free, work, published)\n",
     "            _publish_unit(unit_smem, unit_ready, unit_free, work, published)\n"
     "            slot = " + SLOT.format(count="published") + "\n            _stamp(TL, slot, 8)\n"
     "            _record(TL, slot, 10, num_tiles)\n"),
    ("                    head * stride_q_head, q_buffer, NOPE_DIM)\n",
     "                    head * stride_q_head, q_buffer, NOPE_DIM)\n            _stamp(TL, slot, 9)\n"),
    ("                        STAGES)\n            first_tile += num_tiles\n            published += 1\n",
     "                        STAGES)\n            _stamp(TL, slot, 11)\n            first_tile += num_tiles\n"
     "            published += 1\n"),
    ("    num_units, row_blocks, heads, head_group, TAKEN,\n", "    num_units, row_blocks, heads, head_group, TAKEN, TL,\n"),
    ("                                stride_o_tok, stride_o_head, stride_lse_tok,\n                                0, V_DIM,",
     "                                stride_o_tok, stride_o_head, stride_lse_tok, TL,\n                                0, V_DIM,"),
    ("                                stride_o_tok, stride_o_head, stride_lse_tok,\n                                1, V_DIM,",
     "                                stride_o_tok, stride_o_head, stride_lse_tok, TL,\n                                1, V_DIM,"),
    ("stride_q_head, stride_kn_head, stride_v_head, NOPE_DIM, V_DIM, BLOCK_N, STAGES, CAUSAL,",
     "stride_q_head, stride_kn_head, stride_v_head, TL, NOPE_DIM, V_DIM, BLOCK_N, STAGES, CAUSAL,"),
    ("(*arguments, *self.schedule, self.taken)", "(*arguments, *self.schedule, self.taken, TIMELINE)"),
)
# Phases printed: (name, from event, to event, from the next unit's event instead of this one's).
PHASES = (
    ("unit (wg0 read to next read)", 0, 0, True),
    ("read to first turn, wg0", 0, 2, False),
    ("read to first turn, wg1", 1, 3, False),
    ("tile loop, wg0", 2, 4, False),
    ("tile loop, wg1", 3, 5, False),
    ("last P V + stores, wg0", 4, 6, False),
    ("last P V + stores, wg1", 5, 7, False),
    ("stored to next read, wg0", 6, 0, True),
    ("wg1 stored after wg0", 6, 7, False),
    ("Q issued before wg0's read", 9, 0, False),
    ("published to Q issued", 8, 9, False),
)


def stamp(destination: Path) -> None:
    """A copy of src/ under `destination` whose persistent prefill kernel writes the timeline's stamps."""
    stamped_copy(destination, {"hopper_prefill.py": EDITS})


def run(specs: list[str]) -> None:
    """The timeline of each case (module docstring)."""
    import torch

    from mlakit.bench.prefill import PrefillCase, _triton_kernel, make_attention_inputs
    from mlakit.bench.timing import median_ms
    from mlakit.kernels import hopper_prefill

    if not hasattr(hopper_prefill, "TIMELINE"):
        raise SystemExit("not a stamped copy: run `stamp` first and put its src/ first on PYTHONPATH")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hopper_prefill.TIMELINE = torch.zeros(sms * UNITS * len(EVENTS), dtype=torch.int64, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for spec in specs:
        call = _triton_kernel(None)(make_attention_inputs(PrefillCase.parse(spec), torch.device("cuda")))
        ms = median_ms(call)
        hopper_prefill.TIMELINE.zero_()
        flush.zero_()
        call()
        torch.cuda.synchronize()
        stamps = hopper_prefill.TIMELINE.view(sms, UNITS, len(EVENTS)).cpu().double()
        units = (stamps[:, :, 0] > 0).sum(1)
        print(f"{spec}: {ms * 1000:.0f} us (median of timed calls), units a program {int(units.min())}-"
              f"{int(units.max())}")
        if int(units.max()) >= UNITS:
            print(f"  (programs ran over {UNITS} units: the last slot holds the last one; its phases are left out)")
        rows = []
        for program in range(sms):
            count = min(int(units[program]), UNITS - 1)
            for unit in range(2, count - 2):
                rows.append((stamps[program, unit], stamps[program, unit + 1]))
        if not rows:
            continue
        tiles = sorted({int(r[0][10]) for r in rows})
        print(f"  {'phase (us, median)':32s}" + "".join(f"{t:>8d}t" for t in tiles) + "     all")
        for name, start, end, next_unit in PHASES:
            cells = []
            for selected in [[r for r in rows if int(r[0][10]) == t] for t in tiles] + [rows]:
                spans = torch.tensor([((nxt if next_unit else cur)[end] - cur[start]) / 1000 for cur, nxt in selected])
                cells.append(f"{spans.median():9.2f}")
            print(f"  {name:32s}" + "".join(cells))
        counts = "".join(f"{sum(int(r[0][10]) == t for r in rows):9d}" for t in tiles)
        print(f"  {'units':32s}{counts}{len(rows):9d}")


if __name__ == "__main__":
    main(__doc__, stamp, run)
