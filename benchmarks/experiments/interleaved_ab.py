"""Device experiment: two source trees' prefill attention timed in one process, interleaved, on the same inputs.

Usage, from the repository root on a GPU machine:
    PYTHONPATH=src:tests python benchmarks/experiments/interleaved_ab.py OLD_SRC [--rounds 8] --case 128,8,2048,0 ...
        [--full 16,8,2048,32768:8192 ...]

OLD_SRC is a directory holding an `mlakit` package (e.g. `git archive HEAD src | tar -x -C old` gives old/src). Its
copy is imported as `mlakit_old` (its imports renamed), beside the `mlakit` on PYTHONPATH. Per case, each round times
both trees' `triton_mha_prefill` (`bench prefill`'s attention call: causal, bottom-right; median of do_bench with the
L2 flushed, or with `--sustained` back to back once the clock has settled), the order swapped every round, so that
neither tree always runs first (a tiling's place in a process can move its time by up to 15%, NOTES.md p20).
`--full CASE:CHUNK` times `mla_prefill` end to end instead, as `bench prefill`'s full part does, with prefix chunks
of CHUNK tokens (paged cache, metadata made outside the call). Prints each round's times and, per case, the medians
and the geometric mean of the paired new / old ratios with their range.
"""

from __future__ import annotations

import importlib
import math
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import click
import torch

from mlakit.bench.prefill import FullInputs, PrefillCase
from mlakit.bench.timing import median_ms, sustained_ms

RENAMED = re.compile(r"\bmlakit(?=[.\s])")


def import_old_tree(old_src: Path, scratch: Path):
    """`old_src/mlakit` copied under `scratch` as `mlakit_old` (its own imports renamed) and imported."""
    target = scratch / "mlakit_old"
    shutil.copytree(old_src / "mlakit", target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.rglob("*.py"):
        path.write_text(RENAMED.sub("mlakit_old", path.read_text()))
    sys.path.insert(0, str(scratch))
    return importlib.import_module("mlakit_old")


def attention_call(package: str, case_spec: str):
    """The tree's `bench prefill` attention call (Triton kernel, default tuning) on the case's seeded inputs."""
    bench = importlib.import_module(f"{package}.bench.prefill")
    inputs = bench.make_attention_inputs(bench.PrefillCase.parse(case_spec), torch.device("cuda"))
    return bench._triton_kernel(None)(inputs)


def full_call(package: str, spec: str):
    """The tree's `mla_prefill` over `spec` = CASE:CHUNK, as `bench prefill`'s full part calls it: the inputs from
    `FullInputs` (the same seeded data for both trees), the metadata from the tree's own `plan_prefill`."""
    case_spec, chunk = spec.split(":")
    bench = importlib.import_module(f"{package}.bench.prefill")
    plan_prefill = importlib.import_module(f"{package}.prefill.metadata").plan_prefill
    case = PrefillCase.parse(case_spec)
    inputs = FullInputs.make(case, torch.device("cuda"))
    meta = plan_prefill([case.new_tokens] * case.batch, [case.seq_keys] * case.batch, inputs.paged.block_table,
                        bench.PAGE_SIZE, prefix_chunk_tokens=int(chunk), heads=case.heads)
    return bench._prefill_call(inputs.q, inputs.paged.kv_cache, inputs.weight, meta)


@click.command()
@click.argument("old_src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--case", "cases", multiple=True, help="heads,batch,new_tokens,prefix")
@click.option("--full", "full_cases", multiple=True, help="heads,batch,new_tokens,prefix:chunk_tokens")
@click.option("--rounds", default=8, show_default=True)
@click.option("--sustained", is_flag=True, help="time back to back once the clock has settled (`timing.sustained_ms`)")
def main(old_src: Path, cases: tuple[str, ...], full_cases: tuple[str, ...], rounds: int, sustained: bool) -> None:
    time_ms = sustained_ms if sustained else median_ms
    with tempfile.TemporaryDirectory() as scratch:
        import_old_tree(old_src, Path(scratch))
        print(f"{torch.cuda.get_device_name()}; old tree {old_src}, new tree: the mlakit on PYTHONPATH")
        for spec, make in [(c, attention_call) for c in cases] + [(c, full_call) for c in full_cases]:
            calls = {name: make(package, spec) for name, package in (("old", "mlakit_old"), ("new", "mlakit"))}
            times: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(rounds):
                for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    times[name].append(time_ms(calls[name]))
                print(f"{spec} round {r}: old {times['old'][-1]:.4f} ms, new {times['new'][-1]:.4f} ms")
            ratios = [n / o for n, o in zip(times["new"], times["old"], strict=True)]
            geomean = math.exp(statistics.fmean(math.log(x) for x in ratios))
            print(f"{spec}: old median {statistics.median(times['old']):.4f} ms, new median "
                  f"{statistics.median(times['new']):.4f} ms, new/old geomean {geomean:.4f} "
                  f"(rounds {min(ratios):.4f}-{max(ratios):.4f})")


if __name__ == "__main__":
    main()
