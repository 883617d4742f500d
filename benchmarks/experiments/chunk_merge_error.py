"""Experiment: how a chunked prefill's error grows with the merges a row meets, with the running output in q's
16-bit dtype (one rounding a merge) and in float32 (`mlakit.prefill.mha.MAX_16BIT_MERGES` forced either way).

Usage (CPU is enough: the reference backend merges exactly as the kernels do, in float32 between 16-bit loads
and stores): PYTHONPATH=src:tests python benchmarks/experiments/chunk_merge_error.py [--dtype bf16|fp16]

One sequence of 64 new tokens over a prefix of `chunks` x 256 keys, 4 heads, DeepSeek's head widths (qk 128 + 64,
v 128), Gaussian values. Prints per chunk count (a prefix in one chunk joins the causal pass: no merge) the output's relative error (Frobenius, against the float64
latent-form oracle) of the one-piece plan and of both chunked running outputs, the median of 5 seeds.
"""

from __future__ import annotations

import statistics

import click
import torch
from paged_inputs import relative_error
from test_prefill import Problem

from mlakit.prefill import mha

CHUNK = 256
SEEDS = 5


def chunked_error(problem: Problem, chunks: int, merges_bound: int) -> float:
    bound = mha.MAX_16BIT_MERGES
    mha.MAX_16BIT_MERGES = merges_bound
    try:
        out, _ = problem.run("reference", problem.plan(CHUNK if chunks > 1 else 10**9))
    finally:
        mha.MAX_16BIT_MERGES = bound
    return relative_error(out, problem.latent_form()[0])


@click.command()
@click.option("--dtype", type=click.Choice(["bf16", "fp16"]), default="bf16")
def main(dtype: str) -> None:
    q_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    print(f"{dtype}: relative error against float64, median of {SEEDS} seeds; one piece, then chunked "
          f"in {CHUNK}-key chunks with a float32 / a 16-bit running output")
    for chunks in (1, 2, 3, 4, 5, 6, 8, 12, 16, 32):
        errors = {"one piece": [], "float32": [], "16-bit": []}
        for seed in range(SEEDS):
            problem = Problem([chunks * CHUNK], [64], heads=4, page_size=16, d_nope=128, d_v=128, kv_lora_rank=64,
                              rope_dim=64, q_dtype=q_dtype, exact_decompression=False, seed=seed)
            errors["one piece"].append(chunked_error(problem, 1, 0))
            errors["float32"].append(chunked_error(problem, chunks, -1))
            errors["16-bit"].append(chunked_error(problem, chunks, 10**9))
        row = "  ".join(f"{name} {statistics.median(values):.2e}" for name, values in errors.items())
        print(f"{chunks:3d} prefix chunks ({chunks if chunks > 1 else 0} merges a row): {row}")


if __name__ == "__main__":
    main()
