"""The `mlakit` command line: backends, check, demo."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from mlakit.bench.cli import bench
from mlakit.config import AUTO, KV_CACHE_DTYPES, ServingConfig
from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError, MLAKitError
from mlakit.report import print_plan
from mlakit.registry.catalog import all_records, missing_adapter
from mlakit.registry.resolve import resolve
from mlakit.shape import PRESETS, MLAShape

EXIT_CONFIG_ERROR = 2


class _OneLineErrors(click.Group):
    """Every refusal is one line on stderr and exit 2: mlakit's errors and click's usage errors
    (a bad option value, an unknown command) alike, never a usage block or a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (MLAKitError, click.UsageError) as exc:
            message = exc.format_message() if isinstance(exc, click.UsageError) else str(exc)
            click.echo(f"error: {one_line(message)}", err=True)
            sys.exit(EXIT_CONFIG_ERROR)


def one_line(message: str) -> str:
    r"""A (possibly multi-line, bulleted) message as one line, its lines joined by "; ".

    >>> one_line("backend x cannot serve this:\n  - no fp8\n  - no sm80\nuse: triton")
    'backend x cannot serve this: no fp8; no sm80; use: triton'
    """
    lines = [line.strip().removeprefix("- ") for line in message.splitlines() if line.strip()]
    return " ".join(line + ("" if line.endswith(":") or i == len(lines) - 1 else ";") for i, line in enumerate(lines))


@click.group(cls=_OneLineErrors)
def main() -> None:
    """mlakit: Multi-head Latent Attention for LLM serving."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def backends(as_json: bool) -> None:
    """Every registered backend, whether it is usable on this machine, and its capabilities."""
    device = DeviceInfo.detect()
    rows = []
    for record in all_records():
        why_not = record.hardware_problems(device) + [
            f"package {p} not installed ({record.install_hint})" for p in record.missing_packages()
        ]
        runnable = [phase for phase in sorted(record.phases) if missing_adapter(record.name, phase) is None]
        rows.append(record.describe_capabilities() | {"mlakit_phases": runnable, "usable_here": not why_not, "why_not": why_not})
    if as_json:
        click.echo(json.dumps({"device": device.arch, "backends": rows}, indent=2))
        return
    table = Table(title=f"mlakit backends (this machine: {device.name}, {device.arch})")
    table.add_column("backend", no_wrap=True)
    for column in ("phases", "hardware", "page sizes", "kv dtypes", "max q_len", "graphs", "usable here"):
        table.add_column(column, overflow="fold")
    for row in rows:
        majors = row["compute_capability_majors"]
        hardware = "/".join(row["devices"]) + ("" if majors is None else " SM" + ",".join(f"{m}x" for m in majors))
        table.add_row(
            row["name"],
            "+".join(phase if phase in row["mlakit_phases"] else f"{phase}*" for phase in row["phases"]),
            hardware,
            row["page_sizes"],
            ", ".join(row["kv_dtypes"]) + ("" if row["decode_kv_dtypes"] == row["kv_dtypes"]
                                           else f" (decode: {', '.join(row['decode_kv_dtypes'])})"),
            "any" if row["max_decode_q_len"] is None else str(row["max_decode_q_len"]),
            "yes" if row["cuda_graphs"] else "no",
            "yes" if row["usable_here"] else "no",
        )
    console = Console()
    console.print(table)
    if any(row["mlakit_phases"] != row["phases"] for row in rows):
        console.print("  *: the kernel can do it, but mlakit has no adapter for it yet (resolve() never plans it)", highlight=False)
    for row in rows:
        if row["why_not"]:
            console.print(f"  {row['name']}: not usable here: {'; '.join(row['why_not'])}", highlight=False, soft_wrap=True)


@main.command()
@click.option("--model", type=click.Choice(sorted(PRESETS)), default=None, help="Model shape preset (default deepseek-v3).")
@click.option("--config", "config_path", type=click.Path(), default=None, help="A Hugging Face config.json or its directory.")
@click.option("--attention-backend", default=AUTO, show_default=True)
@click.option("--prefill-backend", default=None)
@click.option("--decode-backend", default=None)
@click.option("--page-size", type=int, default=None, help="Tokens per page (default: chosen to fit).")
@click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default=AUTO, show_default=True)
@click.option("--device-arch", default=None, help="Check for hardware you may not have: cpu, xpu, sm80, sm90, sm100, ...")
@click.option("--tp-size", type=int, default=1, show_default=True)
@click.option("--dcp-size", type=int, default=1, show_default=True, help="Decode context parallelism: ranks of a TP group that split the cache.")
@click.option("--dcp-interleave", type=int, default=1, show_default=True, help="Tokens per block dealt round-robin to the DCP ranks.")
@click.option("--speculative-num-draft-tokens", type=int, default=0, show_default=True)
@click.option("--speculative-eagle-topk", type=int, default=1, show_default=True, help="Draft candidates per step; > 1 is tree drafts.")
@click.option(
    "--speculative-uneven-drafts/--no-speculative-uneven-drafts",
    default=False,
    show_default=True,
    help="Verify batches whose sequences carry different numbers of draft tokens (needs a latent extend kernel).",
)
@click.option("--max-batch-size", type=int, default=256, show_default=True)
@click.option("--max-context-len", type=int, default=32768, show_default=True)
@click.option("--cuda-graphs/--no-cuda-graphs", default=None, help="Default: on where device and backend allow it.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def check(
    model: str | None,
    config_path: str | None,
    attention_backend: str,
    prefill_backend: str | None,
    decode_backend: str | None,
    page_size: int | None,
    kv_cache_dtype: str,
    device_arch: str | None,
    tp_size: int,
    dcp_size: int,
    dcp_interleave: int,
    speculative_num_draft_tokens: int,
    speculative_eagle_topk: int,
    speculative_uneven_drafts: bool,
    max_batch_size: int,
    max_context_len: int,
    cuda_graphs: bool | None,
    as_json: bool,
) -> None:
    """Resolve a serving configuration: print the plan (exit 0) or why it cannot run (exit 2)."""
    if model is not None and config_path is not None:
        raise ConfigError("--model and --config: expected one of them, got both")
    shape = MLAShape.from_hf_config(config_path) if config_path else MLAShape.preset(model or "deepseek-v3")
    config = ServingConfig(
        attention_backend=attention_backend,
        prefill_backend=prefill_backend,
        decode_backend=decode_backend,
        page_size=page_size,
        kv_cache_dtype=kv_cache_dtype,
        tp_size=tp_size,
        dcp_size=dcp_size,
        dcp_interleave=dcp_interleave,
        speculative_num_draft_tokens=speculative_num_draft_tokens,
        speculative_eagle_topk=speculative_eagle_topk,
        speculative_uneven_drafts=speculative_uneven_drafts,
        max_batch_size=max_batch_size,
        max_context_len=max_context_len,
        cuda_graphs=cuda_graphs,
    )
    device = DeviceInfo.from_arch(device_arch) if device_arch else DeviceInfo.detect()
    plan = resolve(config, shape, device)
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        print_plan(plan, Console())


@main.command()
@click.option("--device", default=AUTO, show_default=True, help="auto, cpu, cuda[:N] or xpu[:N].")
@click.option("--decode-backend", default=None, help="Decode backend (default: the plan's choice).")
@click.option("--prefill-backend", default=None, help="Prefill backend (default: the plan's choice), e.g. triton_fp8.")
@click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default=AUTO, show_default=True, help="Default: the plan's on a GPU, float32 on a CPU.")
def demo(device: str, decode_backend: str | None, prefill_backend: str | None, kv_cache_dtype: str) -> None:
    """Generate with a small random DeepSeek-V3 model and check every token against transformers."""
    from mlakit.demo.run import run_model_demo

    sys.exit(run_model_demo(device, Console(), decode_backend=decode_backend, prefill_backend=prefill_backend,
                            kv_cache_dtype=kv_cache_dtype))


@main.command()
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False), required=True, help="Checkpoint directory.")
@click.option("--prompt-ids", "prompts", multiple=True, required=True, help="Comma-separated token ids (repeatable).")
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option("--backend", default=AUTO, show_default=True, help="Decode backend (resolve() checks it).")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--cache-mb", type=int, default=1024, show_default=True, help="Memory budget of the paged latent cache.")
@click.option("--device", default=AUTO, show_default=True, help="auto: under torchrun, this rank's GPU (cuda:LOCAL_RANK).")
@click.option("--tp-size", type=int, default=1, show_default=True, help="Tensor-parallel ranks: one process each, started by torchrun.")
@click.option("--dcp-size", type=int, default=1, show_default=True, help="Decode context parallelism: ranks of a TP group that split the cache.")
@click.option("--dcp-interleave", type=int, default=1, show_default=True, help="Tokens per block dealt round-robin to the DCP ranks.")
def generate(
    model_dir: str, prompts: tuple[str, ...], max_new_tokens: int, backend: str, temperature: float, top_p: float,
    seed: int, cache_mb: int, device: str, tp_size: int, dcp_size: int, dcp_interleave: int,
) -> None:
    """Generate from a local DeepSeek-architecture checkpoint (token ids in and out).

    Multi-GPU: torchrun --nproc-per-node N -m mlakit.cli generate --model DIR --tp-size N [--dcp-size M] ...
    """
    import torch.distributed as dist

    from mlakit.model.generate import run_generate

    try:
        prompt_ids = [[int(t) for t in p.split(",") if t.strip()] for p in prompts]
    except ValueError as exc:
        raise ConfigError(f"--prompt-ids: expected comma-separated integers, got {list(prompts)}") from exc
    try:
        run_generate(model_dir, prompt_ids, max_new_tokens, backend, temperature, top_p, seed, cache_mb << 20, device, Console(),
                     tp_size=tp_size, dcp_size=dcp_size, dcp_interleave=dcp_interleave)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


main.add_command(bench)

if __name__ == "__main__":
    main()
