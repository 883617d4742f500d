"""Device experiment: where a chunked prefix's extra time goes, kernel by kernel (torch.profiler).

Usage: python benchmarks/experiments/prefill_chunk_profile.py HEADS,BATCH,NEW,PREFIX [CHUNK_TOKENS ...]

Runs `mla_prefill` as `bench prefill`'s "full" part does (paged cache of shuffled pages, metadata built outside
the call) for the one-piece plan and each chunk size, three calls each under the profiler after a warm-up, and
prints per plan the CUDA time per call of each kernel name (summed over its launches) with its launch count,
then the difference of each chunked plan from the one-piece plan by kernel.
"""

from __future__ import annotations

import sys

import torch
from cuda_profile import kernel_times

from mlakit.bench.prefill import FullInputs, PrefillCase, _prefill_call

CALLS = 3


def main(spec: str, chunks: list[int]) -> None:
    case = PrefillCase.parse(spec)
    inputs = FullInputs.make(case, torch.device("cuda"))
    plans = {"one_piece": max(1, case.batch * case.prefix), **{f"chunk_{n}": n for n in chunks}}
    profiles = {}
    for name, chunk in plans.items():
        meta = inputs.plan(chunk)
        profiles[name] = kernel_times(_prefill_call(inputs.q, inputs.paged.kv_cache, inputs.weight, meta), CALLS)
        total = sum(us for us, _ in profiles[name].values())
        print(f"{case.label} {name}: {total:.0f} us of kernels a call, {len(meta.prefix_chunks)} prefix chunks")
        for kernel, (us, n) in sorted(profiles[name].items(), key=lambda kv: -kv[1][0]):
            print(f"    {us:9.1f} us  x{n:<4d} {kernel}")
    base = profiles["one_piece"]
    for name in plans:
        if name == "one_piece":
            continue
        print(f"{name} minus one_piece, by kernel:")
        for kernel in sorted(set(base) | set(profiles[name]),
                             key=lambda k: -abs(profiles[name].get(k, (0, 0))[0] - base.get(k, (0, 0))[0])):
            delta = profiles[name].get(kernel, (0, 0))[0] - base.get(kernel, (0, 0))[0]
            if abs(delta) >= 1:
                print(f"    {delta:+9.1f} us  {kernel}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1], [int(n) for n in sys.argv[2:]] or [8192, 4096])
