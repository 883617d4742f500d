"""Summarize the warp-stall samples of one kernel per SASS instruction from an `ncu` source-page export.

On the device:
    ncu --profile-from-start off --set full --import-source no -o /tmp/k python ...   # SourceCounters included
    ncu --import /tmp/k.ncu-rep --page source --csv --print-source sass > sass.csv
Here:
    python benchmarks/experiments/ncu_sass_stalls.py sass.csv --kernel mha_prefill --top 30

Prints the kernel's stall reasons over all samples, then by how often an instruction ran (the tile loop's
instructions run once per tile and warp, so they sort above the prologue's), the share of samples by opcode
within the loop class, and the instructions with the most samples and their leading reasons.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
from pathlib import Path

import click


@dataclasses.dataclass(frozen=True)
class Instruction:
    address: str
    source: str
    executed: int
    samples: int
    stalls: dict[str, int]

    @property
    def mnemonic(self) -> str:
        """The instruction with its modifiers, without its predicate (e.g. `HGMMA.64x64x16.F32.BF16`)."""
        words = self.source.split()
        return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]

    @property
    def opcode(self) -> str:
        return self.mnemonic.split(".")[0]


def kernel_instructions(export: Path, kernel: str) -> tuple[str, list[Instruction]]:
    """The first kernel whose name contains `kernel` in an `ncu --page source --csv` export, and its instructions."""
    name, header, found = None, None, []
    for row in csv.reader(export.open()):
        if row and row[0] == "Kernel Name":
            if found:
                break
            name, header = row[1], None
        elif row and row[0] == "Address":
            header = {column: i for i, column in enumerate(row)}
        elif header and name and kernel in name and row:
            reasons = {c[len("stall_"):]: int(row[i] or 0) for c, i in header.items()
                       if c.startswith("stall_") and "Not Issued" not in c}
            found.append(Instruction(row[header["Address"]], row[header["Source"]].strip(),
                                     int(row[header["Instructions Executed"]] or 0),
                                     int(row[header["Warp Stall Sampling (All Samples)"]] or 0), reasons))
    if not found:
        raise click.ClickException(f"no kernel named like {kernel!r} in {export}")
    return name, found


def _shares(counter: collections.Counter, total: int, top: int) -> str:
    return ", ".join(f"{key} {value / total * 100:.1f}%" for key, value in counter.most_common(top))


@click.command()
@click.argument("export", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--kernel", default="mha_prefill", show_default=True, help="part of the kernel's name")
@click.option("--loop-executions", default=1_000_000, show_default=True,
              help="instructions run at least this often count as the loop's")
@click.option("--top", default=30, show_default=True)
def main(export: Path, kernel: str, loop_executions: int, top: int) -> None:
    name, instructions = kernel_instructions(export, kernel)
    total = sum(i.samples for i in instructions)
    print(f"{name[:80]}: {total} samples, {len(instructions)} instructions")
    print("reasons:", _shares(sum((collections.Counter(i.stalls) for i in instructions), collections.Counter()),
                              total, 10))
    for label, members in (("loop", [i for i in instructions if i.executed >= loop_executions]),
                           ("rest", [i for i in instructions if i.executed < loop_executions])):
        samples = sum(i.samples for i in members)
        reasons = sum((collections.Counter(i.stalls) for i in members), collections.Counter())
        print(f"{label}: {samples / total * 100:.1f}% of samples; reasons: {_shares(reasons, samples, 8)}")
    opcodes = collections.Counter()
    for i in instructions:
        if i.executed >= loop_executions:
            opcodes[i.opcode] += i.samples
    print("loop samples by opcode (share of all):", _shares(opcodes, total, 15))
    for i in sorted(instructions, key=lambda i: -i.samples)[:top]:
        leading = sorted(i.stalls.items(), key=lambda kv: -kv[1])[:3]
        print(f"{i.samples / total * 100:5.1f}% {i.address[-6:]} ran {i.executed:>9} {i.source[:58]:58s} "
              + " ".join(f"{k} {v}" for k, v in leading))


if __name__ == "__main__":
    main()
