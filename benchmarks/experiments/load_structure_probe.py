"""Device experiment: how fast a decode call's cache reads can go under a given load structure, with the
attention maths replaced by a fixed spin (issue 23, the 16-head gap).

A Gluon kernel reads the case's paged cache (the benchmark's inputs: pages in shuffled order) through the
seesaw's TMA boxes (64 columns of TILE tokens) into a ring of STAGES stages, one warpgroup and one program
per SM, and "computes" each tile by spinning DELAY clock cycles per 64 tokens before giving the stage back.
Units (a sequence's token range) go to programs either as the split plan has them, statically (today's
one-round launches), or as finer units taken dynamically with the load pipeline running on across units.
So the table answers, per case: what the load structure alone costs (DELAY 0), what it costs with the
seesaw's compute per tile (~1.8 us of 64 padded rows at 16 heads) or the narrow kernel's (a quarter), and
which structure would reach FlashMLA's time. With `--evict-first`, every structure also runs with its TMA loads
carrying an L2 evict-first cache hint, as FlashMLA's do (`mlakit.kernels.l2_evict_first`: Gluon's TMA copy takes no
hint, so the marked kernel's PTX is rewritten as it compiles).

Usage, from the repository root on an SM90 device:
    python benchmarks/experiments/load_structure_probe.py --out results.json 16,16,4096,1 16,64,1024,1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

sys.path.insert(0, str(Path(__file__).parent))
from cuda_profile import flushed_kernel_times  # noqa: E402
from decode_case import case_inputs, decode_call  # noqa: E402

from mlakit.bench.ceilings import measure_ceilings  # noqa: E402
from mlakit.bench.decode import DecodeCase, anchor_times, environment, time_graph_replay  # noqa: E402
from mlakit.bench.timing import median_ms  # noqa: E402
from mlakit.device import sm_count  # noqa: E402
from mlakit.kernels.hopper_common import matrix_descriptor  # noqa: E402
from mlakit.kernels.l2_evict_first import evict_first_tma_loads, mark_evict_first  # noqa: E402
from mlakit.kernels.launch import ptx_rewritten  # noqa: E402
from mlakit.kernels.gluon_compat import thread_barrier  # noqa: E402

CHUNK = gl.constexpr(64)
WIDTH = gl.constexpr(576)


@gluon.constexpr_function
def _spin_asm(cycles):
    return ("{ .reg .u64 t0, t1; .reg .pred p; mov.u64 t0, %clock64; SPIN: mov.u64 t1, %clock64; "
            f"sub.u64 t1, t1, t0; setp.lt.u64 p, t1, {cycles}; @p bra SPIN; }} mov.u32 $0, 0;")


@gluon.jit
def _spin(CYCLES: gl.constexpr):
    if CYCLES > 0:
        gl.inline_asm_elementwise(_spin_asm(CYCLES), "=r,r", [gl.program_id(0)], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gluon.jit
def _next_unit(UNITS, TAKEN, unit, num_units, programs, DYNAMIC: gl.constexpr):
    """The unit after `unit` and its (sequence, first token, end); end == first token where none is left."""
    if DYNAMIC:
        unit = programs + gl.atomic_add(TAKEN, 1)
    else:
        unit = unit + programs
    b, tok, end = _unit_entry(UNITS, unit, num_units)
    return unit, b, tok, end


@gluon.jit
def _unit_entry(UNITS, unit, num_units):
    """Unit `unit`'s (sequence, first token, end); end == first token past the last unit."""
    entry = UNITS + gl.minimum(unit, num_units - 1) * 3
    tok = gl.load(entry + 1)
    return gl.load(entry), tok, gl.where(unit < num_units, gl.load(entry + 2), tok)


@gluon.jit
def _issue(DESC, BLOCK_TABLE, UNITS, TAKEN, ring, ready, stage, unit, b, tok, end, num_units, programs, stride_bt,
           TILE: gl.constexpr, PAGE_SIZE: gl.constexpr, DYNAMIC: gl.constexpr):
    """Loads the cursor's next tile into `stage` (taking the next unit when the cursor's is done); returns the
    moved cursor and whether a tile was issued."""
    if tok >= end:
        unit, b, tok, end = _next_unit(UNITS, TAKEN, unit, num_units, programs, DYNAMIC)
    pred = tok < end
    chunks: gl.constexpr = ring.shape[0] // ready.shape[0]
    row = gl.load(BLOCK_TABLE + b * stride_bt + tok // PAGE_SIZE, mask=pred, other=0) * PAGE_SIZE + tok % PAGE_SIZE
    mbarrier.expect(ready.index(stage), TILE * CHUNK * chunks * 2, pred=pred)
    for c in gl.static_range(chunks):
        tma.async_copy_global_to_shared(DESC, [row, c * CHUNK], ready.index(stage), ring.index(stage * chunks + c),
                                        pred=pred)
    return unit, b, gl.where(pred, tok + TILE, tok), end, pred.to(gl.int32)


@gluon.jit
def load_probe_kernel(DESC, BLOCK_TABLE, UNITS, TAKEN, SINK, num_units, stride_bt,
                      TILE: gl.constexpr, STAGES: gl.constexpr, DELAY: gl.constexpr, PAGE_SIZE: gl.constexpr,
                      DYNAMIC: gl.constexpr, EVICT_FIRST: gl.constexpr):
    if EVICT_FIRST:
        mark_evict_first()
    programs = gl.num_programs(0)
    chunks: gl.constexpr = WIDTH // CHUNK
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE, CHUNK], gl.bfloat16)
    ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * chunks, TILE, CHUNK], layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)

    unit = gl.program_id(0)
    b, tok, end = _unit_entry(UNITS, unit, num_units)
    issued = 0
    for st in gl.static_range(STAGES):
        unit, b, tok, end, more = _issue(DESC, BLOCK_TABLE, UNITS, TAKEN, ring, ready, st, unit, b, tok, end,
                                         num_units, programs, stride_bt, TILE, PAGE_SIZE, DYNAMIC)
        issued += more

    read_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    total = gl.zeros([TILE, CHUNK], gl.float32, layout=read_layout)
    consumed = 0
    while consumed < issued:
        stage = consumed % STAGES
        mbarrier.wait(ready.index(stage), (consumed // STAGES) & 1)
        total += ring.index(stage * chunks).load(read_layout).to(gl.float32)
        _spin(DELAY * TILE // 64)
        thread_barrier()
        unit, b, tok, end, more = _issue(DESC, BLOCK_TABLE, UNITS, TAKEN, ring, ready, stage, unit, b, tok, end,
                                         num_units, programs, stride_bt, TILE, PAGE_SIZE, DYNAMIC)
        issued += more
        consumed += 1
    gl.store(SINK + gl.program_id(0), gl.sum(gl.sum(total, 1), 0))
    gl.atomic_add(SINK + programs, consumed)


def plan_units(seqlens: list[int], splits: list[int]) -> list[tuple[int, int, int]]:
    """The split plan's units: (sequence, first token, end) per split, as `split_range` cuts them."""
    units = []
    for b, (n, s) in enumerate(zip(seqlens, splits)):
        per = -(-(-(-n // 64)) // s) * 64
        units += [(b, i * per, min(n, (i + 1) * per)) for i in range(s) if i * per < n]
    return units


def fine_units(seqlens: list[int], tokens: int) -> list[tuple[int, int, int]]:
    """Units of `tokens` tokens, longest sequences' first."""
    order = sorted(range(len(seqlens)), key=lambda b: -seqlens[b])
    return [(b, t, min(seqlens[b], t + tokens)) for b in order for t in range(0, seqlens[b], tokens)]


STRUCTURES = {
    # name: (units, tile tokens, stages, dynamic)
    "plan 2x64": ("plan", 64, 2, False),
    "plan 3x64": ("plan", 64, 3, False),
    "plan 4x32": ("plan", 32, 4, False),
    "plan 6x32": ("plan", 32, 6, False),
    "u256 dyn 2x64": (256, 64, 2, True),
    "u128 dyn 2x64": (128, 64, 2, True),
    "u256 dyn 6x32": (256, 32, 6, True),
    "u128 dyn 6x32": (128, 32, 6, True),
}


@click.command()
@click.argument("cases", nargs=-1, required=True)
@click.option("--delays", default="0,900,3400", help="Spin cycles per 64 tokens.")
@click.option("--structures", default=",".join(STRUCTURES))
@click.option("--evict-first", is_flag=True, help="Also run each structure with evict-first TMA loads.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
def main(cases: tuple[str, ...], delays: str, structures: str, evict_first: bool, out: Path | None) -> None:
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    anchors, _ = anchor_times()
    programs = sm_count(device)
    rows = []
    print(f"copy ceiling {ceilings.copy_gb_per_s:.0f} GB/s (read + write), matmul {ceilings.matmul_tflop_per_s:.0f}")
    for spec in cases:
        case = DecodeCase.parse(spec)
        inputs, plan = case_inputs(case)
        pages = inputs.kv_cache
        assert pages.dtype == torch.bfloat16 and pages.shape[-1] == WIDTH.value
        seqlens = inputs.cache_seqlens.tolist()
        splits = plan.num_splits.tolist()[:len(seqlens)]
        rows_view = pages.reshape(-1, WIDTH.value)
        cache_bytes = sum(seqlens) * WIDTH.value * 2
        anchor = anchors.get(case.anchor_key) or {}
        ours_us = time_graph_replay(decode_call(inputs, plan))
        kernels = {name: round(us, 2) for name, us in flushed_kernel_times(decode_call(inputs, plan)).items()}
        rows.append(dict(case=spec, structure="mlakit decode (graph replay)", time_us=ours_us, kernels_us=kernels))
        print(f"{spec:<16} our decode {ours_us:7.1f} us (graph replay, flushed); kernels {kernels}", flush=True)
        variants = [(name, hint) for name in structures.split(",") for hint in ((False, True) if evict_first else (False,))]
        for name, hint in variants:
            kind, tile, stages, dynamic = STRUCTURES[name]
            units = plan_units(seqlens, splits) if kind == "plan" else fine_units(seqlens, kind)
            unit_tensor = torch.tensor(units, dtype=torch.int32, device=device).reshape(-1)
            desc = matrix_descriptor((rows_view.data_ptr(), rows_view.dtype, tuple(rows_view.shape),
                                      tuple(rows_view.stride())), (tile, CHUNK.value))
            # 3.7 keys its in-memory kernels by the compile scope too: the timed calls run in it as well.
            with ptx_rewritten(evict_first_tma_loads):
                for delay in (int(d) for d in delays.split(",")):
                    taken = torch.zeros(1 << 16, dtype=torch.int32, device=device)
                    sink = torch.zeros(programs + 1, dtype=torch.float32, device=device)
                    calls = [0]
                    constants = dict(TILE=tile, STAGES=stages, DELAY=delay, PAGE_SIZE=pages.shape[1], DYNAMIC=dynamic,
                                     EVICT_FIRST=hint, num_warps=4)

                    def call():
                        # A fresh counter per call, 16-byte aligned (the kernel is specialized on that).
                        slot = taken[calls[0] * 4 % taken.numel():]
                        calls[0] += 1
                        load_probe_kernel[(programs,)](
                            desc, inputs.block_table, unit_tensor, slot, sink, len(units), inputs.block_table.stride(0),
                            **constants)

                    call()
                    torch.cuda.synchronize()
                    expected = sum(-(-(e - t) // tile) for _, t, e in units)
                    assert int(sink[programs].item()) == expected, (int(sink[programs].item()), expected)
                    us = median_ms(call, rep_ms=200) * 1e3
                    kernel_us = next(us for name, us in flushed_kernel_times(call).items() if "load_probe" in name)
                    row = dict(case=spec, structure=name, evict_first=hint, delay_cycles=delay, units=len(units), time_us=us,
                               kernel_us=kernel_us,
                               read_tb_per_s=cache_bytes / us / 1e6,
                               read_over_copy=cache_bytes / us / 1e3 / ceilings.copy_gb_per_s)
                    rows.append(row)
                    print(f"{spec:<16} {name:<15} {'ef' if hint else '  '} delay {delay:5d}  units {len(units):5d}  {us:7.1f} us  "
                          f"kernel {kernel_us:6.1f} us  {row['read_tb_per_s']:.2f} TB/s  {row['read_over_copy']:.2f} of copy", flush=True)
        print(f"{spec}: anchors {anchor}", flush=True)
    if out:
        out.write_text(json.dumps({"environment": environment(device, ceilings), "results": rows}, indent=1))


if __name__ == "__main__":
    main()
