"""`mlakit generate`: load a checkpoint, resolve a plan, generate with a progress bar; under
torchrun with `tp_size > 1`, one rank per process (all compute, rank 0 prints)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from mlakit.cache import PagedLatentCache, num_pages_for_budget
from mlakit.config import AUTO, ServingConfig
from mlakit.config.hf import HFConfig
from mlakit.distributed.groups import ParallelGroups, join_ranks
from mlakit.errors import ConfigError
from mlakit.model.deepseek import DeepseekConfig
from mlakit.model.loader import load_model
from mlakit.model.runner import Request, Runner
from mlakit.registry.resolve import resolve
from mlakit.report import print_plan
from mlakit.serving.warmup import warm_up


def build_runner(
    model_dir: str | Path,
    config: ServingConfig,
    cache_budget_bytes: int,
    console: Console,
    *,
    mixed_steps: bool = False,
    parallel: ParallelGroups | None = None,
) -> Runner:
    """Resolves `config` for the checkpoint's shape, warms its kernels up on a GPU, prints the plan,
    loads the model and sizes the paged cache from `cache_budget_bytes`; with `mixed_steps`, new
    prompts join the running decodes in one step; with `parallel`, this rank's part of the model
    (and of the cache under decode context parallelism).

    On a CPU the weights are float32 and so is the cache unless `config.kv_cache_dtype` names
    one (the reference path, exact against transformers); on a GPU the weights are bf16 and the
    cache takes the plan's dtype.
    """
    hf_config = HFConfig.load(Path(model_dir) / "config.json")
    model_config = DeepseekConfig.from_hf_config(hf_config, config.tp_size)
    plan = resolve(config, hf_config.mla_shape())
    if plan.device.kind == "cuda":
        plan = warm_up(plan)
    print_plan(plan, console)
    device = plan.device.torch_device
    on_cpu = device.type == "cpu"
    cache_dtype = "fp32" if on_cpu and config.kv_cache_dtype == AUTO else plan.kv_cache_dtype
    shape = model_config.attention.shape
    pages = num_pages_for_budget(cache_budget_bytes, plan.page_size, shape.kv_cache_dim, model_config.num_layers, cache_dtype)
    cache = PagedLatentCache(
        pages, plan.page_size, shape.kv_lora_rank, shape.qk_rope_head_dim, dtype=cache_dtype, device=device,
        num_layers=model_config.num_layers,
    )
    model = load_model(model_dir, dtype=torch.float32 if on_cpu else torch.bfloat16, device=device, parallel=parallel)
    console.print(
        f"model: {model_config.num_layers} layers, {shape.num_heads} heads{' per rank' if config.tp_size > 1 else ''}, latent {shape.kv_lora_rank}+{shape.qk_rope_head_dim}; "
        f"cache: {pages} pages of {plan.page_size} tokens in {cache_dtype}"
    )
    return Runner(
        model, cache, decode_backend=plan.decode_backend, prefill_backend=plan.prefill_backend, max_batch_size=config.max_batch_size,
        mixed_steps=mixed_steps,
    )


def run_generate(
    model_dir: str | Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    backend: str,
    temperature: float,
    top_p: float,
    seed: int,
    cache_budget_bytes: int,
    device: str,
    console: Console,
    *,
    tp_size: int = 1,
    dcp_size: int = 1,
    dcp_interleave: int = 1,
) -> list[list[int]]:
    """Generates for each prompt and prints the plan, the token ids (and text, if the directory
    has a tokenizer) and decode tokens/s. With `tp_size > 1` this process is one torchrun rank
    (`join_ranks`); every rank computes, rank 0 prints."""
    if not prompts:
        raise ConfigError("prompts: expected at least one prompt, got none")
    config = ServingConfig(decode_backend=backend, device=device, max_batch_size=len(prompts), tp_size=tp_size,
                           dcp_size=dcp_size, dcp_interleave=dcp_interleave)
    config, parallel = join_ranks(config)
    if parallel is not None and parallel.rank != 0:
        console = Console(quiet=True)
    runner = build_runner(model_dir, config, cache_budget_bytes, console, parallel=parallel)
    requests = [Request(p, max_new_tokens, temperature=temperature, top_p=top_p, seed=seed + i) for i, p in enumerate(prompts)]
    began = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("generating", total=None)
        outputs = runner.generate(requests, on_token=lambda: progress.advance(task))
    seconds = time.perf_counter() - began
    tokenizer = _tokenizer(model_dir)
    for prompt, output in zip(prompts, outputs):
        text = f"  {tokenizer.decode(output)!r}" if tokenizer is not None else ""
        console.print(f"{prompt} -> {output}{text}", highlight=False, soft_wrap=True)
    stats = runner.stats
    console.print(
        f"{sum(map(len, outputs))} tokens in {seconds:.2f} s; decode {stats.decode_tokens / max(stats.decode_seconds, 1e-9):.0f} tokens/s"
    )
    return outputs


def _tokenizer(model_dir: str | Path):
    if not any((Path(model_dir) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
