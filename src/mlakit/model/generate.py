"""`mlakit generate`: load a checkpoint, resolve a plan, generate with a progress bar."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from mlakit.cache import PagedLatentCache, num_pages_for_budget
from mlakit.config import ServingConfig
from mlakit.model.deepseek import DeepseekConfig
from mlakit.model.loader import load_model, read_config
from mlakit.model.runner import Request, Runner
from mlakit.registry.resolve import resolve
from mlakit.report import print_plan
from mlakit.shape import MLAShape


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
) -> list[list[int]]:
    """Generates for each prompt and prints the plan, the token ids (and text, if the directory
    has a tokenizer) and decode tokens/s."""
    hf_config = read_config(model_dir)
    config = DeepseekConfig.from_hf_config(hf_config)
    plan = resolve(
        ServingConfig(decode_backend=backend, device=device, max_batch_size=len(prompts)), MLAShape.from_hf_config(hf_config)
    )
    print_plan(plan, console)
    dev = plan.device.torch_device
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    cache_dtype = "fp32" if dev.type == "cpu" else plan.kv_cache_dtype
    shape = config.attention.shape
    pages = num_pages_for_budget(cache_budget_bytes, plan.page_size, shape.kv_cache_dim, config.num_layers, cache_dtype)
    cache = PagedLatentCache(
        pages, plan.page_size, shape.kv_lora_rank, shape.qk_rope_head_dim, dtype=cache_dtype, device=dev, num_layers=config.num_layers
    )
    model = load_model(model_dir, dtype=dtype, device=dev)
    requests = [Request(p, max_new_tokens, temperature=temperature, top_p=top_p, seed=seed + i) for i, p in enumerate(prompts)]
    runner = Runner(model, cache, decode_backend=plan.decode_backend)
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
