"""Device experiment: an in-kernel timeline of the decode seesaw (globaltimer stamps), the tool behind v49.

Usage, from the repository root on an SM90 device:
    python benchmarks/experiments/seesaw_timeline.py stamp .device/tl        # a stamped copy of src/ there
    PYTHONPATH=.device/tl/src:tests python benchmarks/experiments/seesaw_timeline.py run 128,64,1024,1 128,64,ragged,2

`stamp` copies the package and inserts, into that copy's `hopper_decode/seesaw_kernel.py` and
`hopper_decode/seesaw_partitions.py`, eight globaltimer stamps per unit (unit start, prologue done, warpgroup 0's first
softmax, each warpgroup's loop end and stores done, unit end), written to an int64 buffer (`hopper_decode/dispatch.py`'s
TIMELINE) passed as the seesaw's KV_SCALE argument (bf16 caches never read it). It fails,
naming the anchor, when the kernel's source no longer has the text it anchors on: update the anchors then.
`run` times each case (CUDA-graph replay, as the benchmark does), then runs one eager call after an L2 flush (with
`--warm` before the cases: right after another call, no flush: L2 holds what that call left) and prints, per event,
the min / median / max over programs (us from the first program's first stamp), for each program's first unit and for its last later one, per-program medians of the phases, and the programs that end
last and first with their units and KV tiles.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kernel_stamps import main, stamp_functions, stamped_copy

EVENTS = ("unit start", "prologue", "S0 done(wg0)", "loop end wg0", "loop end wg1", "stored wg0", "stored wg1",
          "unit end")
# `_stamp` and `_record`, put into each module that stamps.
STAMPS = stamp_functions(len(EVENTS))
# Per module of src/mlakit/kernels: (anchor, replacement) pairs applied in order; each anchor must occur exactly once.
EDITS = {
    "hopper_decode/seesaw_partitions.py": (
        ("@gluon.jit\ndef _seesaw_even_partition(", STAMPS + "@gluon.jit\ndef _seesaw_even_partition("),
        ("    num_splits, scale_log2, kv_scale, OUT, LSE, PART_OUT, PART_LSE, OUT_STRIDES, LSE_STRIDES, PART_STRIDES, last,\n"
         "    HEADS: gl.constexpr,",
         "    num_splits, scale_log2, kv_scale, OUT, LSE, PART_OUT, PART_LSE, OUT_STRIDES, LSE_STRIDES, PART_STRIDES, last,\n"
         "    TL, slot, HEADS: gl.constexpr,"),
        ("    num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES, pieces,\n    HEADS: gl.constexpr,",
         "    num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES, pieces, TL, slot,\n"
         "    HEADS: gl.constexpr,"),
        ("        p0, scale0, m_i = online_softmax(_masked_near_end(s, tok0, end, visible, unmasked_end), m_i, 1, scale_log2)\n",
         "        p0, scale0, m_i = online_softmax(_masked_near_end(s, tok0, end, visible, unmasked_end), m_i, 1, scale_log2)\n"
         "        if pair == 0:\n            _stamp(TL, slot, 2)\n"),
        ("    lse, inv_l = finish_rows(m_i, l_i)\n    if FP8:\n",
         "    _stamp(TL, slot, 3)\n    lse, inv_l = finish_rows(m_i, l_i)\n    if FP8:\n"),
        ("               LSE_STRIDES, PART_STRIDES, HEADS)\n\n\n@gluon.jit\ndef _seesaw_odd_partition(",
         "               LSE_STRIDES, PART_STRIDES, HEADS)\n    _stamp(TL, slot, 5)\n\n\n@gluon.jit\ndef _seesaw_odd_partition("),
        ("    take_over(ROW_SUMS_READY)\n", "    _stamp(TL, slot, 4)\n    take_over(ROW_SUMS_READY)\n"),
        ("                OUT_STRIDES, PART_STRIDES, HEADS, o_layout)\n\n\n@gluon.jit\ndef _even_right_values(",
         "                OUT_STRIDES, PART_STRIDES, HEADS, o_layout)\n    _stamp(TL, slot, 6)\n\n\n"
         "@gluon.jit\ndef _even_right_values("),
    ),
    "hopper_decode/seesaw_kernel.py": (
        ("@gluon.jit(do_not_specialize=[\"stride_bt_b\", \"work_rows\"], "
         "do_not_specialize_on_alignment=[\"row_tiles\"])\ndef mla_decode_hopper_seesaw_kernel(",
         STAMPS + "@gluon.jit(do_not_specialize=[\"stride_bt_b\", \"work_rows\"], "
         "do_not_specialize_on_alignment=[\"row_tiles\"])\ndef mla_decode_hopper_seesaw_kernel("),
        ("    while unit < units:\n", "    stamp_tiles = 0\n    while unit < units:\n"),
        ("        if _runs((b, split, num_splits, first_token, q_len, seqlen), tile, HEADS):\n",
         "        slot = gl.program_id(0) * 2 + gl.minimum(units_done - 1, 1)\n"
         "        _stamp(KV_SCALE, slot, 0)\n"
         # Per program (slot 2 x programs + p): its units so far and their KV tiles (`split_range`'s).
         "        _, _, stamp_unit_tiles = split_range(WORK, unit // row_tiles, seqlen)\n"
         "        stamp_tiles += stamp_unit_tiles\n"
         "        _record(KV_SCALE, 2 * programs + gl.program_id(0), 0, units_done)\n"
         "        _record(KV_SCALE, 2 * programs + gl.program_id(0), 1, stamp_tiles)\n"
         "        if _runs((b, split, num_splits, first_token, q_len, seqlen), tile, HEADS):\n"),
        (" LSE_STRIDES, PART_STRIDES, last, prefetch, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3_SCORES,\n",
         " LSE_STRIDES, PART_STRIDES, last, prefetch, KV_SCALE, slot, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3_SCORES,\n"),
        ("    OUT, LSE, PART_OUT, PART_LSE, scale_log2, kv_scale, Q_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, "
         "PART_STRIDES,\n    last, prefetch, HEADS: gl.constexpr,",
         "    OUT, LSE, PART_OUT, PART_LSE, scale_log2, kv_scale, Q_STRIDES, stride_bt_b, OUT_STRIDES, LSE_STRIDES, "
         "PART_STRIDES,\n    last, prefetch, TL, slot, HEADS: gl.constexpr,"),
        ("    fence_async_shared()\n    thread_barrier()\n\n    m_even, scale_even",
         "    fence_async_shared()\n    thread_barrier()\n    _stamp(TL, slot, 1)\n\n    m_even, scale_even"),
        ("            PART_STRIDES, last, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3, LEFT_SCORES_AHEAD)),",
         "            PART_STRIDES, last, TL, slot, HEADS, PAGE_SIZE, KV_LORA_RANK, E4M3, LEFT_SCORES_AHEAD)),"),
        ("            num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES, prefetch[0],\n            HEADS, PAGE_SIZE, "
         "KV_LORA_RANK, E4M3, PREFETCH_PAIRS)),",
         "            num_splits, scale_log2, OUT, PART_OUT, OUT_STRIDES, PART_STRIDES, prefetch[0],\n            TL, slot, HEADS, "
         "PAGE_SIZE, KV_LORA_RANK, E4M3, PREFETCH_PAIRS)),"),
        ("    ], [4], [248])\n", "    ], [4], [248])\n    _stamp(TL, slot, 7)\n"),
    ),
    "hopper_decode/dispatch.py": (
        ("MERGE_MAX_SPLITS = 4\n", "MERGE_MAX_SPLITS = 4\n# seesaw_timeline.py: an int64 [programs * 2 * 8] tensor of stamps, "
         "passed as KV_SCALE (bf16 only)\nTIMELINE = None\n"),
        ("kv_scale if fp8 else work_state,", "kv_scale if fp8 else TIMELINE,"),
    ),
}


def stamp(destination: Path) -> None:
    """A copy of src/ under `destination` whose seesaw kernel writes the timeline's stamps."""
    stamped_copy(destination, EDITS)


def run(specs: list[str]) -> None:
    """The timeline of each case (module docstring; `--warm` among `specs`: without the flush)."""
    import torch

    warm = "--warm" in specs
    specs = [spec for spec in specs if spec != "--warm"]

    sys.path.insert(0, str(Path(__file__).parent))
    from decode_case import case_inputs, decode_call

    from mlakit.bench.decode import DecodeCase, time_graph_replay
    from mlakit.kernels.hopper_decode import dispatch

    if not hasattr(dispatch, "TIMELINE"):
        raise SystemExit("not a stamped copy: run `stamp` first and put its src/ first on PYTHONPATH")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dispatch.TIMELINE = torch.zeros(sms * 3 * 8, dtype=torch.int64, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for spec in specs:
        inputs, plan = case_inputs(DecodeCase.parse(spec))
        call = decode_call(inputs, plan)
        graph_us = time_graph_replay(call)
        torch.cuda.synchronize()
        if warm:
            call()
        else:
            flush.zero_()
        dispatch.TIMELINE.zero_()
        call()
        torch.cuda.synchronize()
        stamps = dispatch.TIMELINE[: sms * 2 * 8].view(sms, 2, 8).cpu()
        counts = dispatch.TIMELINE[sms * 2 * 8:].view(sms, 8)[:, :2].cpu()
        started = stamps[:, 0, 0] > 0
        first = stamps[started, 0, 0].min()
        print(f"{spec}{' (warm L2)' if warm else ''}: graph replay {graph_us:.1f} us, kernel span (stamps) {(stamps.max() - first) / 1000:.1f} us, "
              f"programs with a unit {int(started.sum())}, with a later one {int((stamps[:, 1, 0] > 0).sum())}")
        for unit, label in ((0, "first unit"), (1, "last later unit")):
            rows = stamps[stamps[:, unit, 0] > 0, unit]
            if len(rows) == 0:
                continue
            print(f"  {label}:")
            for event, name in enumerate(EVENTS):
                times = rows[:, event][rows[:, event] > 0]
                if len(times):
                    us = (times - first).double() / 1000
                    print(f"    {name:14s} min {us.min():7.1f}  median {us.median():7.1f}  max {us.max():7.1f}")
            whole = rows[(rows > 0).all(1)].double() / 1000
            phase = (whole[:, 1:] - whole[:, :-1]).median(0).values
            print(f"    medians a program: prologue {phase[0]:.1f}, to S0 {phase[1]:.1f}, loop {phase[2]:.1f}, "
                  f"warpgroup 0 stores {(whole[:, 5] - whole[:, 3]).median():.1f}, warpgroup 1 from loop end to "
                  f"stored {(whole[:, 6] - whole[:, 4]).median():.1f}")
        ends = (stamps[:, :, 7].max(1).values - first).double() / 1000
        last_start = (torch.where(stamps[:, 1, 0] > 0, stamps[:, 1, 0], stamps[:, 0, 0]) - first).double() / 1000
        ranked = [p for p in ends.argsort(descending=True).tolist() if stamps[p, 0, 0] > 0]
        print("  programs by end (us): program, units, KV tiles (one row tile each), last unit's start, end")
        for p in ranked[:8] + ranked[-4:]:
            print(f"    {p:4d} {int(counts[p, 0]):3d} units {int(counts[p, 1]):5d} tiles  last start {last_start[p]:6.1f}  "
                  f"end {ends[p]:6.1f}")
        busy = torch.tensor(ranked)
        print(f"  tiles against end: correlation {torch.corrcoef(torch.stack([counts[busy, 1].double(), ends[busy]]))[0, 1]:.2f}; "
              f"tiles min / median / max {int(counts[busy, 1].min())} / {int(counts[busy, 1].median())} / "
              f"{int(counts[busy, 1].max())}")


if __name__ == "__main__":
    main(__doc__, stamp, run)
