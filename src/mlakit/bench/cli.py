"""`mlakit bench` commands (also `python -m mlakit.bench`)."""

from __future__ import annotations

from pathlib import Path

import click
import torch

from mlakit.bench import prefill as prefill_bench
from mlakit.bench.ceilings import measure_ceilings
from mlakit.bench.decode import (
    DecodeCase,
    DecodeInputs,
    KernelFactory,
    default_cases,
    environment,
    plot_results,
    run_cases,
    write_results,
)
from mlakit.device import DeviceInfo
from mlakit.registry.catalog import all_records, get_backend

SIMPLE_TRITON = "16,32,4,2,2,8"


@click.group()
def bench() -> None:
    """Benchmarks on the local CUDA device."""


def _tuned_kernel(spec: str | None) -> KernelFactory:
    """Our Triton kernel with its split plan built per batch, outside the timed call
    (`spec` "block_m,block_n,warps,stages[,programs_per_sm[,fixed_splits]]"; None: default tuning)."""
    from mlakit.kernels.triton_decode import DecodeTuning, plan_decode, triton_mla_decode

    tuning = None
    if spec is not None:
        fields = [int(x) for x in spec.split(",")]
        tuning = DecodeTuning(*fields[:5], fixed_splits=fields[5] if len(fields) > 5 else None)

    def prepare(inputs: DecodeInputs):
        _, q_len, heads, _ = inputs.q.shape
        plan = plan_decode(inputs.cache_seqlens, q_len=q_len, heads=heads, tuning=tuning)
        return lambda: triton_mla_decode(
            inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
            kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale, plan=plan,
        )

    return prepare


def _backend_kernel(name: str) -> KernelFactory:
    """A registered backend's decode entry point, everything inside the timed call."""
    decode = get_backend(name).decode

    def prepare(inputs: DecodeInputs):
        return lambda: decode(
            inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
            kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale,
        )

    return prepare


@bench.command()
@click.option("--quick", is_flag=True, help="A subset of the grid (the anchor rows plus spot checks).")
@click.option("--case", "case_specs", multiple=True, help="heads,batch,seqlen|ragged,q_len,kv_dtype,page_size (repeatable).")
@click.option("--tuning", "tunings", multiple=True, help="NAME=block_m,block_n,warps,stages[,programs_per_sm[,fixed_splits]] extra Triton variants.")
@click.option("--no-baseline", is_flag=True, help=f"Skip the simple split-KV Triton yardstick ({SIMPLE_TRITON}).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=Path("decode_bench.json"), show_default=True)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=Path("decode_bench.png"), show_default=True)
def decode(quick: bool, case_specs: tuple[str, ...], tunings: tuple[str, ...], no_baseline: bool, json_path: Path, plot_path: Path) -> None:
    """Times every decode backend usable here (and the yardstick) over the case grid."""
    if not torch.cuda.is_available():
        raise click.ClickException("mlakit bench decode needs a CUDA device")
    device = torch.device("cuda")
    info = DeviceInfo.detect(device)
    kernels: dict[str, KernelFactory] = {}
    for record in all_records():
        usable = "decode" in record.phases and not record.hardware_problems(info) and not record.missing_packages()
        if usable and record.name not in ("reference", "triton") and record.returns_lse:
            kernels[record.name] = _backend_kernel(record.name)
    kernels["triton"] = _tuned_kernel(None)
    for spec in tunings:
        name, _, fields = spec.partition("=")
        kernels[name] = _tuned_kernel(fields)
    if not no_baseline:
        kernels["simple"] = _tuned_kernel(SIMPLE_TRITON)
    cases = [_parse_case(s) for s in case_specs] or default_cases(quick)
    ceilings = measure_ceilings(device)
    click.echo(f"ceilings: copy {ceilings.copy_gb_per_s:.0f} GB/s, bf16 matmul {ceilings.matmul_tflop_per_s:.0f} TFLOP/s")
    rows = run_cases(cases, kernels, device, ceilings, click.echo)
    write_results(json_path, environment(device, ceilings), rows)
    plot_results(plot_path, rows)
    click.echo(f"wrote {json_path} and {plot_path}")


def _parse_case(spec: str) -> DecodeCase:
    heads, batch, seqlen, q_len, kv_dtype, page_size = spec.split(",")
    return DecodeCase(int(heads), int(batch), None if seqlen == "ragged" else int(seqlen), int(q_len), kv_dtype, int(page_size))


@bench.command()
@click.option("--quick", is_flag=True, help="The two 128-head targets (n8192 p0, n2048 p32768) plus spot checks.")
@click.option("--case", "case_specs", multiple=True, help="heads,batch,new_tokens,prefix (repeatable).")
@click.option("--tuning", "tunings", multiple=True, help="NAME=block_m,block_n,warps,stages extra Triton attention variants.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=Path("prefill_bench.json"), show_default=True)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=Path("prefill_bench.png"), show_default=True)
def prefill(quick: bool, case_specs: tuple[str, ...], tunings: tuple[str, ...], json_path: Path, plot_path: Path) -> None:
    """Times the MHA-form prefill: the Triton attention kernel vs SDPA (and FlashAttention), and mla_prefill end to end."""
    if not torch.cuda.is_available():
        raise click.ClickException("mlakit bench prefill needs a CUDA device")
    try:
        cases = [prefill_bench.PrefillCase.parse(s) for s in case_specs] or prefill_bench.default_cases(quick)
        variants = dict(prefill_bench.parse_tuning(s) for s in tunings)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    click.echo(f"ceilings: copy {ceilings.copy_gb_per_s:.0f} GB/s, bf16 matmul {ceilings.matmul_tflop_per_s:.0f} TFLOP/s")
    budget = 0.9 * torch.cuda.get_device_properties(device).total_memory
    run = prefill_bench.run_cases(cases, variants, device, ceilings, budget, click.echo)
    for line in prefill_bench.summary(run.results):
        click.echo(line)
    prefill_bench.write_results(json_path, environment(device, ceilings), run, budget)
    prefill_bench.plot_results(plot_path, run.results)
    click.echo(f"wrote {json_path} and {plot_path}")


@bench.command()
@click.option("--layers", type=int, default=8, show_default=True)
@click.option("--heads", type=int, default=128, show_default=True)
@click.option("--new-tokens", type=int, default=32, show_default=True)
@click.option("--model-dtype", type=click.Choice(["bf16", "fp32"]), default="bf16", show_default=True)
@click.option("--backend", default="triton", show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=Path("generation_check.json"), show_default=True)
def generation(layers: int, heads: int, new_tokens: int, model_dtype: str, backend: str, json_path: Path) -> None:
    """A random DeepSeek-V3-latent model through mlakit vs transformers (fp32), with decode tokens/s."""
    import json

    from mlakit.bench.generation import run_generation_check

    if not torch.cuda.is_available():
        raise click.ClickException("mlakit bench generation needs a CUDA device")
    dtype = torch.bfloat16 if model_dtype == "bf16" else torch.float32
    result = run_generation_check(layers, heads, new_tokens, [7, 33, 120, 500], dtype, backend, click.echo)
    json_path.write_text(json.dumps(result, indent=1))
