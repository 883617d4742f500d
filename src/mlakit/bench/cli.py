"""`mlakit bench` commands (also `python -m mlakit.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
import torch
from click.core import ParameterSource

from mlakit.bench import overhead as overhead_bench
from mlakit.bench import prefill as prefill_bench
from mlakit.bench.ceilings import measure_ceilings
from mlakit.bench.decode import (
    ANCHORS,
    DecodeCase,
    DecodeInputs,
    KernelFactory,
    default_cases,
    environment,
    plot_results,
    run_cases,
    write_results,
)
from mlakit.bench.peers import backend_kernel, parse_backends, usable_decode_backends
from mlakit.bench.decode_targets import anchor_simple_triton_times, check_round3_targets, check_targets, result_rows
from mlakit.bench.timing import median_ms, sustained_ms
from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError

if TYPE_CHECKING:
    from mlakit.bench.graphs import GraphBenchSettings

SIMPLE_TRITON = "16,32,4,2,2,8"


@click.group()
def bench() -> None:
    """Benchmarks on the local CUDA device."""


def _require_cuda(command: str) -> None:
    """ConfigError (the command line's one-line refusal, exit 2) unless a CUDA device is there to time."""
    if not torch.cuda.is_available():
        raise ConfigError(f"mlakit bench {command}: expected a CUDA device (it times GPU kernels), got none")


def _tuned_kernel(spec: str | None) -> KernelFactory:
    """Our Triton kernel with its split plan built per batch, outside the timed call
    (`spec` "block_m,block_n,warps,stages[,programs_per_sm[,fixed_splits]][,tier]"; None: default tuning)."""
    from mlakit.kernels.triton_decode import DecodeTuning, plan_decode, triton_mla_decode

    tuning = None
    if spec is not None:
        parts = spec.split(",")
        tier = parts.pop() if not parts[-1].isdigit() else "auto"
        fields = [int(x) for x in parts]
        tuning = DecodeTuning(*fields[:5], fixed_splits=fields[5] if len(fields) > 5 else None, tier=tier)

    def prepare(inputs: DecodeInputs):
        _, q_len, heads, _ = inputs.q.shape
        plan = plan_decode(inputs.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=inputs.kv_cache.dtype,
                           tuning=tuning, page_size=inputs.kv_cache.shape[1])
        return lambda: triton_mla_decode(
            inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
            kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale, plan=plan,
        )

    return prepare


def _timing(sustained: bool) -> tuple[Callable[[Callable[[], object]], float], str]:
    """The `--sustained` flag's timer for calls and ceilings, and its name for the log and the results file."""
    return (sustained_ms, "sustained") if sustained else (median_ms, "flushed")


GRID_OPTIONS = ("quick", "grid_heads", "case_specs", "backends_spec", "tunings", "no_baseline", "plot_path", "sustained",
                "clean_l2")
GRAPH_OPTIONS = ("graph_heads", "graph_context", "graph_q_len", "graph_backend", "graph_layers", "graph_batches", "graph_steps",
                 "tp_size", "dcp_size", "dcp_interleave")
GRAPHS_JSON = Path("decode_graphs_bench.json")


@bench.command()
@click.option("--quick", is_flag=True, help="A subset of the grid (the anchor rows plus spot checks).")
@click.option("--heads", "grid_heads", type=int, multiple=True,
              help="Only the grid's cases with these head counts (repeatable; splits a long run into parts; "
                   "--case entries are kept as given).")
@click.option("--case", "case_specs", multiple=True, help="heads,batch,seqlen|~seqlen|ragged,q_len[,kv_dtype[,page_size]] (repeatable; bf16 and 64 when left out; ~seqlen: lengths within 20% of it).")
@click.option("--backends", "backends_spec", default=None,
              help="Comma-separated decode backends to time side by side, e.g. triton,flashmla,flashinfer_mla; ratios are to "
                   "the first. Default: triton, then every other decode backend usable here. Named ones not installed here "
                   "are listed and left out.")
@click.option("--tuning", "tunings", multiple=True, help="NAME=block_m,block_n,warps,stages[,programs_per_sm[,fixed_splits]][,auto|portable] extra Triton variants.")
@click.option("--no-baseline", is_flag=True, help=f"Skip the simple split-KV Triton yardstick ({SIMPLE_TRITON}).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=Path("decode_bench.json"), show_default=True,
              help=f"Results file (with --graphs the default is {GRAPHS_JSON}).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=Path("decode_bench.png"), show_default=True)
@click.option("--sustained", is_flag=True, help="Time graph replays (and the ceilings) back to back once the clock has "
                                                "settled under the power cap, instead of do_bench's median with the L2 "
                                                "flushed before each replay. A cache that fits L2 (~40 MB) then stays "
                                                "there, unlike a model's many layers: use it for larger caches.")
@click.option("--clean-l2", is_flag=True, help="Time graph replays with L2 full of clean lines before each (256 MB "
                                               "read), instead of do_bench's flush, which writes and leaves dirty lines "
                                               "the call must write back first (closer to a model, whose attention "
                                               "follows weight reads).")
@click.option("--graphs", "graphs", is_flag=True,
              help="Instead of the kernel grid: eager vs CUDA-graph time per decode step of a DeepSeek-V3 attention stack "
                   "(one mla_decode per layer on its own cache; no projections, no MoE).")
@click.option("--graph-heads", type=int, default=128, show_default=True,
              help="--graphs: query heads in all, heads / --tp-size per rank (128: DeepSeek-V3; 16 at TP1: one TP8 rank's share).")
@click.option("--graph-context", type=int, default=4096, show_default=True,
              help="--graphs: mean tokens per sequence (random lengths within +-25%, fixed seed).")
@click.option("--graph-q-len", type=int, default=1, show_default=True, help="--graphs: query tokens per sequence (k + 1 for speculative verify).")
@click.option("--graph-backend", default="triton", show_default=True, help="--graphs: decode backend (must be capturable).")
@click.option("--graph-layers", type=int, default=61, show_default=True, help="--graphs: attention layers per step.")
@click.option("--graph-batches", default="1,16,64", show_default=True, help="--graphs: batch sizes (one graph bucket each).")
@click.option("--graph-steps", type=int, default=100, show_default=True, help="--graphs: timed steps per measurement (after 10 warmup steps).")
@click.option("--tp-size", type=int, default=1, show_default=True,
              help="--graphs: ranks, one process per GPU under torchrun --nproc-per-node N; each holds heads / N query heads.")
@click.option("--dcp-size", type=int, default=1, show_default=True,
              help="--graphs: decode context parallelism; each group of this many ranks splits every sequence's cache.")
@click.option("--dcp-interleave", type=int, default=1, show_default=True, help="--graphs: tokens dealt to a DCP rank at a time.")
@click.pass_context
def decode(
    ctx: click.Context,
    quick: bool,
    grid_heads: tuple[int, ...],
    case_specs: tuple[str, ...],
    backends_spec: str | None,
    tunings: tuple[str, ...],
    no_baseline: bool,
    json_path: Path,
    plot_path: Path,
    sustained: bool,
    clean_l2: bool,
    graphs: bool,
    graph_heads: int,
    graph_context: int,
    graph_q_len: int,
    graph_backend: str,
    graph_layers: int,
    graph_batches: str,
    graph_steps: int,
    tp_size: int,
    dcp_size: int,
    dcp_interleave: int,
) -> None:
    """Times decode backends side by side (each with its per-step metadata built outside the timed call, as
    its own API intends) and the yardstick over the case grid; with --graphs, the eager vs CUDA-graph time
    per step of a whole decode attention stack instead."""
    given = {name for name in (*GRID_OPTIONS, *GRAPH_OPTIONS) if ctx.get_parameter_source(name) != ParameterSource.DEFAULT}
    if graphs and given & set(GRID_OPTIONS):
        flags = ", ".join(sorted("--" + _option_flag(n) for n in given & set(GRID_OPTIONS)))
        raise click.UsageError(f"--graphs replaces the kernel grid; drop {flags}")
    if sustained and clean_l2:
        raise click.UsageError("--sustained times replays back to back, without a flush; drop --clean-l2 or --sustained")
    if not graphs and given & set(GRAPH_OPTIONS):
        flags = ", ".join(sorted("--" + _option_flag(n) for n in given & set(GRAPH_OPTIONS)))
        raise click.UsageError(f"{flags} only apply with --graphs")
    settings = None
    if graphs:
        settings = _graph_settings(graph_heads, graph_context, graph_q_len, graph_backend, graph_layers, graph_batches, graph_steps,
                                   tp_size, dcp_size, dcp_interleave)
    try:
        parsed = [DecodeCase.parse(s) for s in case_specs]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--case") from exc
    _require_cuda("decode")
    if settings is not None:
        if ctx.get_parameter_source("json_path") == ParameterSource.DEFAULT:
            json_path = GRAPHS_JSON
        _decode_graphs(settings, json_path)
        return
    device = torch.device("cuda")
    info = DeviceInfo.detect(device)
    if backends_spec is None:
        names = ["triton", *(n for n in usable_decode_backends(info) if n != "triton")]
    else:
        try:
            names, notes = parse_backends(backends_spec, info)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--backends") from exc
        for note in notes:
            click.echo(f"left out: {note}")
    kernels: dict[str, KernelFactory] = {name: backend_kernel(name, info) for name in names}
    for spec in tunings:
        name, _, fields = spec.partition("=")
        kernels[name] = _tuned_kernel(fields)
    if not no_baseline:
        kernels["simple"] = _tuned_kernel(SIMPLE_TRITON)
    cases = parsed or [
        case for case in default_cases(quick) if not grid_heads or case.heads in grid_heads
    ]
    if not cases:
        raise click.UsageError(f"--heads: the grid has no case with {', '.join(map(str, grid_heads))} heads")
    timing = "clean-l2" if clean_l2 else _timing(sustained)[1]
    ceilings = measure_ceilings(device, sustained=sustained)
    click.echo(f"ceilings: copy {ceilings.copy_gb_per_s:.0f} GB/s, bf16 matmul {ceilings.matmul_tflop_per_s:.0f} TFLOP/s"
               f" ({timing} timing)")
    rows = run_cases(cases, kernels, device, ceilings, click.echo, timing)
    if not rows:
        raise click.ClickException("no kernel ran a case: each failed or was skipped (the lines above say why)")
    write_results(json_path, {**environment(device, ceilings), "timing": timing}, rows)
    plot_results(plot_path, rows)
    click.echo(f"wrote {json_path} and {plot_path}")
    _echo_targets(rows)


@bench.command()
@click.option("--case", "case_specs", multiple=True,
              help="kind,heads,batch,seqlen,new with kind decode, extend or prefill (repeatable; default: the issue's grid).")
@click.option("--calls", type=int, default=overhead_bench.CALLS, show_default=True,
              help="Calls per host-time loop (kept below the launch queue's depth).")
@click.option("--profile", default=None, help="Also print torch.profiler's host table for the calls whose name "
                                                "contains this (e.g. mla_prefill).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=Path("overhead_bench.json"), show_default=True)
def overhead(case_specs: tuple[str, ...], calls: int, profile: str | None, json_path: Path) -> None:
    """Host time per eager call (a loop of calls without sync), beside the eager (do_bench) and CUDA-graph
    replay times: mla_decode, mla_extend, mla_prefill, the drop-in entry points and, where installed,
    FlashMLA and FlashInfer."""
    try:
        cases = [overhead_bench.OverheadCase.parse(spec) for spec in case_specs] or overhead_bench.default_cases()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--case") from exc
    _require_cuda("overhead")
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    rows = overhead_bench.run_cases(cases, device, click.echo, calls, profile)
    write_results(json_path, environment(device, ceilings), rows)
    click.echo(f"wrote {json_path}")


@bench.command("decode-targets")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def decode_targets(results: tuple[Path, ...]) -> None:
    """The decode issues' H100 speed targets (issue 3's, then issue 23's against FlashMLA rows of the same run),
    checked against `mlakit bench decode` JSON files (e.g. a grid run in parts)."""
    _echo_targets(result_rows(results))


def _echo_targets(rows: list[dict[str, object]]) -> None:
    for check in [*check_targets(rows, anchor_simple_triton_times(ANCHORS)), *check_round3_targets(rows)]:
        click.echo(check.line())


def _option_flag(name: str) -> str:
    return {"case_specs": "case", "tunings": "tuning", "plot_path": "plot", "grid_heads": "heads"}.get(name, name).replace("_", "-")


def _graph_settings(heads: int, context: int, q_len: int, backend: str, layers: int, batches: str, steps: int,
                    tp_size: int, dcp_size: int, dcp_interleave: int) -> GraphBenchSettings:
    """The --graphs settings from the options (a bad value is a usage error, found before any device work)."""
    from mlakit.bench.graphs import GraphBenchSettings

    try:
        batch_sizes = tuple(int(b) for b in batches.split(","))
        return GraphBenchSettings(layers=layers, heads=heads, batches=batch_sizes, context=context, q_len=q_len, backend=backend,
                                  steps=steps, tp_size=tp_size, dcp_size=dcp_size, dcp_interleave=dcp_interleave)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _decode_graphs(settings: GraphBenchSettings, json_path: Path) -> None:
    """`bench decode --graphs`: mlakit.bench.graphs does the work, on every rank under torchrun
    (`join_ranks`); CLI errors for what it refuses."""
    import torch.distributed as dist

    from mlakit.bench import graphs as graphs_bench
    from mlakit.distributed import join_ranks

    # Refusals: no torchrun or the wrong world size, a backend that cannot run, be captured or merge
    # the ranks' results, caches beyond the memory budget.
    try:
        graphs_bench.check_backend(settings)  # before any process joins
        config, parallel = join_ranks(settings.serving_config(), "-m mlakit.bench decode --graphs")
        device = torch.device("cuda" if parallel is None else config.device)
        if parallel is not None:
            torch.cuda.set_device(device)
        results = graphs_bench.run_and_report(settings, device, json_path, click.echo, parallel)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    bad = [r.batch for r in results if not r.ok]
    if bad:
        raise click.ClickException(
            f"graph output differs from eager at batch {bad} (relative error > {graphs_bench.MAX_REL_ERROR}); see {json_path}"
        )


@bench.command()
@click.option("--quick", is_flag=True, help="The two 128-head targets (n8192 p0, n2048 p32768) plus spot checks.")
@click.option("--case", "case_specs", multiple=True, help="heads,batch,new_tokens,prefix (repeatable).")
@click.option("--tuning", "tunings", multiple=True, help="NAME=block_m,block_n,warps,stages[,kernel] extra attention variants (kernel: portable, "
                                                         "hopper or hopper_persistent, e.g. h64=128,64,4,3,hopper).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=Path("prefill_bench.json"), show_default=True)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=Path("prefill_bench.png"), show_default=True)
@click.option("--sustained", is_flag=True, help="Time every call (and the ceilings) back to back once the clock has "
                                                "settled under the power cap, instead of do_bench's median with the "
                                                "L2 flushed before each call.")
@click.option("--fp8", is_flag=True, help="Also time the e4m3 attention kernel (SM90): alone on rounded operands "
                                          "(triton_fp8) and with the rounding in the call (triton_fp8_e2e).")
def prefill(quick: bool, case_specs: tuple[str, ...], tunings: tuple[str, ...], json_path: Path, plot_path: Path,
            sustained: bool, fp8: bool) -> None:
    """Times the MHA-form prefill: the Triton attention kernel vs SDPA (and FlashAttention), and mla_prefill end to end."""
    _require_cuda("prefill")
    try:
        cases = [prefill_bench.PrefillCase.parse(s) for s in case_specs] or prefill_bench.default_cases(quick)
        variants = dict(prefill_bench.parse_tuning(s) for s in tunings)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    device = torch.device("cuda")
    time_ms, timing = _timing(sustained)
    ceilings = measure_ceilings(device, sustained=sustained)
    click.echo(f"ceilings: copy {ceilings.copy_gb_per_s:.0f} GB/s, bf16 matmul {ceilings.matmul_tflop_per_s:.0f} TFLOP/s"
               f" ({timing} timing)")
    budget = 0.9 * torch.cuda.get_device_properties(device).total_memory
    run = prefill_bench.run_cases(cases, variants, device, ceilings, budget, click.echo, time_ms, fp8=fp8)
    for line in prefill_bench.summary(run.results):
        click.echo(line)
    prefill_bench.write_results(json_path, {**environment(device, ceilings), "timing": timing}, run, budget)
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

    _require_cuda("generation")
    dtype = torch.bfloat16 if model_dtype == "bf16" else torch.float32
    result = run_generation_check(layers, heads, new_tokens, [7, 33, 120, 500], dtype, backend, click.echo)
    json_path.write_text(json.dumps(result, indent=1))
