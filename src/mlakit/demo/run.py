"""`mlakit demo`: the demo model generated through mlakit with continuous batching and mixed steps,
then checked against transformers (float32) with `teacher_forced_verdict`."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console

from mlakit.config import AUTO, ServingConfig
from mlakit.demo.checkpoint import DEMO_DIR, ensure_demo_checkpoint
from mlakit.demo.verdict import Verdict, gap_bound, teacher_forced_verdict
from mlakit.model.generate import build_runner
from mlakit.model.runner import Request, Runner
from mlakit.registry.catalog import get_backend

DEMO_PROMPTS = ([11, 402, 7, 99, 250], list(range(30, 71)), [5], [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311])
DEMO_NEW_TOKENS = 16
CACHE_BUDGET_BYTES = 64 << 20


def run_model_demo(
    device: str,
    console: Console,
    *,
    decode_backend: str | None = None,
    prefill_backend: str | None = None,
    kv_cache_dtype: str = AUTO,
    directory: Path = DEMO_DIR,
) -> int:
    """Generates for the demo prompts and prints the verdict; returns the exit code (0: passed).

    On a CPU the weights and cache are float32 and the tokens must be transformers' own; on a
    GPU the weights are bf16 and the cache takes the plan's dtype (or `kv_cache_dtype`), and a
    token may differ only where transformers' logits nearly tie (`mlakit.demo.verdict`), within the
    bound of the coarsest dtype on the path: the cache's, or a backend's attention (`triton_fp8`: e4m3).
    """
    ensure_demo_checkpoint(directory, say=lambda line: console.print(line, highlight=False))
    config = ServingConfig(device=device, decode_backend=decode_backend, prefill_backend=prefill_backend,
                           kv_cache_dtype=kv_cache_dtype,
                           max_batch_size=len(DEMO_PROMPTS), max_context_len=256)
    runner = build_runner(directory, config, CACHE_BUDGET_BYTES, console, mixed_steps=True)
    requests = [Request(list(p), DEMO_NEW_TOKENS, arrival_step=2 * i) for i, p in enumerate(DEMO_PROMPTS)]
    began = time.perf_counter()
    outputs = runner.generate(requests)
    seconds = time.perf_counter() - began
    stats = runner.stats
    console.print(
        f"generated {sum(map(len, outputs))} tokens for {len(requests)} prompts (lengths {[len(p) for p in DEMO_PROMPTS]}, "
        f"joining the running decodes at steps 0/2/4/6) in {seconds:.2f} s: {stats.prefill_steps} steps with a prefill "
        f"(mixed with decodes) and {stats.decode_steps} decode steps, "
        f"{stats.decode_tokens / max(stats.decode_seconds, 1e-9):.0f} decode tokens/s"
    )
    verdict = _verdict(directory, runner, outputs)
    for d in verdict.divergences:
        console.print(f"  prompt {d.prompt}, token {d.position}: mlakit {d.ours}, transformers {d.theirs}, gap {d.gap:.2g}")
    console.print(f"verdict ({_covered(runner)}): {verdict.summary()}")
    cut_short = _cut_short(outputs, runner.model.config.eos_token_ids)
    if cut_short:
        console.print(f"outputs of prompts {cut_short} stop before {DEMO_NEW_TOKENS} tokens without an EOS token")
    return 0 if verdict.passed and len(outputs) == len(DEMO_PROMPTS) and not cut_short else 1


def _cut_short(outputs: list[list[int]], eos_token_ids: tuple[int, ...]) -> list[int]:
    """The prompts whose output is neither DEMO_NEW_TOKENS long nor ended by an EOS token (the
    verdict reads only the tokens that came, so it cannot see missing ones).

    >>> _cut_short([[1] * DEMO_NEW_TOKENS, [4, 2], [], [4]], eos_token_ids=(2,))
    [2, 3]
    """
    return [i for i, out in enumerate(outputs) if len(out) != DEMO_NEW_TOKENS and not (out and out[-1] in eos_token_ids)]


def _verdict(directory: Path, runner: Runner, outputs: list[list[int]]) -> Verdict:
    from transformers import AutoModelForCausalLM
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(runner.cache.device).eval()
    attention = (get_backend(name).record.attention_dtype for name in (runner.decode_backend, runner.prefill_backend))
    return teacher_forced_verdict(hf, DEMO_PROMPTS, outputs, gap_bound(runner.cache.stores[0].dtype, *attention))


def _covered(runner: Runner) -> str:
    weights = str(next(runner.model.parameters()).dtype).removeprefix("torch.")
    return (f"decode {runner.decode_backend}, prefill {runner.prefill_backend}, weights {weights}, "
            f"KV cache {runner.cache.stores[0].dtype}, on {runner.cache.device}")
