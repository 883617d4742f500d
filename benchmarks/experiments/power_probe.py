"""Device experiment: the SM clock and power a kernel runs at, sustained (is a case power-bound?).

Usage, from the repository root on a GPU machine (FlashMLA on PYTHONPATH for its decode rows):
    PYTHONPATH=src:tests:benchmarks/experiments python benchmarks/experiments/power_probe.py \
        --prefill 128,1,8192,0 --decode 128,64,1024,1

For the cuBLAS matmul of `bench`'s ceiling; per prefill case (heads,batch,new,prefix) our attention and SDPA on
`bench prefill`'s inputs; per decode case (`DecodeCase.parse`'s spec) our decode and FlashMLA's, each
captured GRAPH_CALLS times in one CUDA graph (their host cost would otherwise set the pace): runs the call back to
back for SECONDS (`timing.sustained_ms`) while `nvidia-smi` samples the SM clock, power draw and active clock
throttle reasons every 100 ms, and prints the medians of the samples taken in the second half of the run (after the
clock has settled) with the call's mean time.
"""

from __future__ import annotations

import statistics
import subprocess

import click
import torch

from mlakit.bench.prefill import PrefillCase, _sdpa, _triton_kernel, make_attention_inputs
from mlakit.bench.timing import sustained_ms

SECONDS = 4.0
GRAPH_CALLS = 20
QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"


def sustained(name: str, call, calls_per_call: int = 1) -> None:
    """`timing.sustained_ms` of `call` (settling for half of SECONDS, timed over the other half) under nvidia-smi's
    sampling: the medians of the second half's samples and the time per call (`calls_per_call` of the timed calls
    in each, for a graph's replay)."""
    sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                               stdout=subprocess.PIPE, text=True)
    per_call_us = sustained_ms(call, SECONDS / 2, SECONDS / 2) / calls_per_call * 1e3
    sampler.terminate()
    rows = [line.split(", ") for line in sampler.stdout.read().strip().splitlines()]
    settled = rows[len(rows) // 2:]
    clock = statistics.median(float(r[0]) for r in settled)
    power = statistics.median(float(r[1]) for r in settled)
    reasons = sorted({r[2] for r in settled})
    print(f"{name:28s} {per_call_us:9.1f} us a call, SM clock {clock:6.0f} MHz, power {power:5.0f} W, "
          f"throttle reasons {reasons}")


def graphed(call, calls: int = GRAPH_CALLS):
    """`calls` calls of `call` captured in one CUDA graph (after a warm-up call): the graph's replay."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    return graph.replay


def decode_calls(spec: str) -> dict[str, object]:
    """Our decode and (where installed, for 16-bit caches) FlashMLA's on the case's inputs, as the decode benchmark
    times them."""
    from decode_case import case_inputs, decode_call

    from mlakit.bench.decode import DecodeCase
    from mlakit.bench.peers import _flashmla_call

    case = DecodeCase.parse(spec)
    inputs, plan = case_inputs(case)
    calls = {"triton": decode_call(inputs, plan)}
    if case.kv_dtype == "bf16":  # FlashMLA's dense decode reads 16-bit caches only
        try:
            calls["flashmla"] = _flashmla_call(inputs)
        except ImportError:
            pass
    return calls


@click.command()
@click.option("--prefill", "prefill_specs", multiple=True, help="heads,batch,new_tokens,prefix")
@click.option("--decode", "decode_specs", multiple=True, help="heads,batch,seqlen|~seqlen|ragged,q_len[,kv_dtype]")
def main(prefill_specs: tuple[str, ...], decode_specs: tuple[str, ...]) -> None:
    print(torch.cuda.get_device_name())
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    sustained("cuBLAS 8192^3 bf16", lambda: a @ a)
    for spec in prefill_specs:
        inputs = make_attention_inputs(PrefillCase.parse(spec), torch.device("cuda"))
        sustained(f"{spec} triton", _triton_kernel(None)(inputs))
        sustained(f"{spec} sdpa", _sdpa(inputs))
    for spec in decode_specs:
        for name, call in decode_calls(spec).items():
            sustained(f"{spec} {name}", graphed(call), GRAPH_CALLS)


if __name__ == "__main__":
    main()
