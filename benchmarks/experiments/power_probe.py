"""Device experiment: the SM clock and power a kernel runs at, sustained (is a case power-bound?).

Usage, from the repository root on a GPU machine:
    PYTHONPATH=src:tests python benchmarks/experiments/power_probe.py 128,1,8192,0 16,1,8192,0

For the cuBLAS matmul of `bench`'s ceiling and, per case, our prefill attention and SDPA on `bench prefill`'s inputs:
runs the call back to back for SECONDS while `nvidia-smi` samples the SM clock, power draw and active clock
throttle reasons every 100 ms, and prints the medians of the samples taken in the second half of the run (after
the clock has settled) with the call's mean time.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch

from mlakit.bench.prefill import PrefillCase, _sdpa, _triton_kernel, make_attention_inputs

SECONDS = 4.0
QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"


def sustained(name: str, call) -> None:
    """`call` back to back for SECONDS under nvidia-smi's sampling; the settled medians."""
    call()
    torch.cuda.synchronize()
    sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                               stdout=subprocess.PIPE, text=True)
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < SECONDS:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
        calls += 10
    elapsed = time.perf_counter() - start
    sampler.terminate()
    rows = [line.split(", ") for line in sampler.stdout.read().strip().splitlines()]
    settled = rows[len(rows) // 2:]
    clock = statistics.median(float(r[0]) for r in settled)
    power = statistics.median(float(r[1]) for r in settled)
    reasons = sorted({r[2] for r in settled})
    print(f"{name:28s} {elapsed / calls * 1e3:8.3f} ms a call, SM clock {clock:6.0f} MHz, power {power:5.0f} W, "
          f"throttle reasons {reasons}")


def main(specs: list[str]) -> None:
    print(torch.cuda.get_device_name())
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    sustained("cuBLAS 8192^3 bf16", lambda: a @ a)
    for spec in specs:
        inputs = make_attention_inputs(PrefillCase.parse(spec), torch.device("cuda"))
        sustained(f"{spec} triton", _triton_kernel(None)(inputs))
        sustained(f"{spec} sdpa", _sdpa(inputs))


if __name__ == "__main__":
    main(sys.argv[1:])
