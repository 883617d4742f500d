"""Two kernels of one `ncu` source-page export side by side (e.g. our seesaw and FlashMLA's decode kernel, profiled on
the same inputs by `peer_profile_case.py`): the tile loop's instructions by opcode (the loop = the instructions run
most often), then where each kernel waits on wgmma completion (`WARPGROUP.DEPBAR`: its share of the samples and the
MMA it waits for) and on named barriers (samples stalled on "barrier" after each `BAR.SYNC`, by barrier id).

Usage: python benchmarks/experiments/ncu_sass_compare.py sass.csv seesaw flash_fwd_splitkv_mla
"""

from __future__ import annotations

import collections
from pathlib import Path

import click
from ncu_sass_stalls import Instruction, kernel_instructions


def loop_executions(instructions: list[Instruction]) -> int:
    """How often the tile loop's instructions ran: the execution count most instructions share among those run at
    least a quarter as often as the most-run one (barrier spin loops run more often than the loop, the prologue less)."""
    most = max(i.executed for i in instructions)
    counts = collections.Counter(i.executed for i in instructions if i.executed >= most / 4)
    return counts.most_common(1)[0][0]


def loop_opcodes(instructions: list[Instruction], loop: int) -> collections.Counter:
    """The instructions run `loop` times (the tile loop's) by opcode, wgmma shapes and barrier kinds kept apart."""
    return collections.Counter(i.mnemonic if i.opcode in ("HGMMA", "BAR", "WARPGROUP") else i.opcode
                               for i in instructions if i.executed == loop)


def wait_sites(instructions: list[Instruction], loop: int) -> tuple[list[str], collections.Counter]:
    """Each `WARPGROUP.DEPBAR` run `loop` times with its share of the samples and the last MMA shape before it, and
    the samples stalled on "barrier" by where they wait: a wgmma wait (the DEPBAR's own) or the `BAR.SYNC` before them
    (by id)."""
    total = sum(i.samples for i in instructions) or 1
    depbars, waits = [], collections.Counter()
    last_mma, since, site = "-", 0, None
    for i in instructions:
        since += 1
        if i.opcode == "HGMMA":
            last_mma, since = i.mnemonic, 0
        if "DEPBAR" in i.source:
            site = "wgmma wait"
            if i.executed == loop:
                depbars.append(f"{i.samples / total * 100:5.1f}% {i.source[:34]:34s} {since:3d} instructions after "
                               f"{last_mma}")
        if site:
            waits[site] += i.stalls.get("barrier", 0) / total * 100
        if "BAR.SYNC" in i.source:
            site = " ".join(i.source.split()[1:]).rstrip(" ;")
    return depbars, waits


@click.command()
@click.argument("export", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("first")
@click.argument("second")
def main(export: Path, first: str, second: str) -> None:
    kernels = [instructions for _, instructions in (kernel_instructions(export, name) for name in (first, second))]
    loops = [loop_executions(instructions) for instructions in kernels]
    counts = [loop_opcodes(instructions, loop) for instructions, loop in zip(kernels, loops)]
    print(f"loop instructions by opcode: {first} / {second}")
    for op in sorted(set(counts[0]) | set(counts[1]), key=lambda op: (-(counts[0][op] + counts[1][op]), op)):
        print(f"  {op:34s} {counts[0][op]:5d} {counts[1][op]:5d}")
    print(f"  {'total':34s} {sum(counts[0].values()):5d} {sum(counts[1].values()):5d}")
    for name, instructions, loop in zip((first, second), kernels, loops):
        depbars, named = wait_sites(instructions, loop)
        print(f"{name}: wgmma waits in the loop (share of samples)")
        print("\n".join(f"  {line}" for line in depbars))
        print(f"{name}: barrier stalls by where they wait: "
              + ", ".join(f"{bar} {share:.1f}%" for bar, share in named.most_common(8)))


if __name__ == "__main__":
    main()
