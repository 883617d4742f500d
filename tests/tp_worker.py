"""The rank processes of the model-level TP / DCP tests (tests/test_distributed_model.py): gloo on
CPU, the demo model (16 heads) with float32 weights and cache.

Every rank loads its slices of the demo checkpoint for each layout, runs scripted steps
(prefill, decode, extend with a cached prefix, mixed) through `reserve_step` and the model, and
compares the logits with one process running the same steps (computed in the rank itself);
then generates the demo prompts with the Runner (greedy and sampled, mixed steps) and writes
the tokens to `rank{r}.json` for the tests to compare with one process and transformers.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch
import torch.distributed as dist

from mlakit import PagedLatentCache, ServingConfig
from mlakit.distributed import ParallelGroups, init_parallel
from mlakit.model.deepseek import DeepseekForCausalLM
from mlakit.model.loader import load_model
from mlakit.model.runner import Request, Runner
from mlakit.model.steps import reserve_step

LAYOUTS = {2: ((2, 1, 1), (2, 2, 1)), 4: ((4, 1, 1), (4, 2, 3), (4, 4, 2))}  # world -> (tp_size, dcp_size, interleave)
PAGE_SIZE = 6  # a multiple of every interleave above
NUM_PAGES = 64
PROMPTS = ([11, 402, 7, 99, 250], list(range(30, 61)), [5], [300, 301, 302, 303, 304, 305, 306])
NEW_TOKENS = 8
SAMPLING = {"temperature": 0.8, "top_p": 0.9}
# Scripted steps: per step, (sequence, new token ids); a sequence continues where it stopped.
STEPS = (
    ((0, list(range(100, 113))), (1, [5])),                              # prefill 13 and 1 tokens
    ((0, [7]), (1, [8])),                                                # decode
    ((0, [9, 10, 11, 12, 13]), (1, [14]), (2, list(range(200, 220)))),  # extend 5 + decode + prefill 20 (mixed)
    ((2, list(range(220, 238))), (0, [15])),                             # extend 18 on a cached prefix + decode
)


def requests(sampled: bool) -> list[Request]:
    """The generation requests: prompts joining at steps 0/1/2/3 (mixed steps)."""
    options = SAMPLING if sampled else {}
    return [Request(list(p), NEW_TOKENS, arrival_step=i, seed=i, **options) for i, p in enumerate(PROMPTS)]


def generate(model: DeepseekForCausalLM, sampled: bool, *, device: str = "cpu", cache_dtype: str = "fp32",
             backend: str = "auto") -> list[list[int]]:
    """The tokens of `requests(sampled)` through a Runner with mixed steps on a fresh cache."""
    shape = model.config.attention.shape
    cache = PagedLatentCache(NUM_PAGES, PAGE_SIZE, shape.kv_lora_rank, shape.qk_rope_head_dim, dtype=cache_dtype,
                             device=device, num_layers=model.config.num_layers)
    return Runner(model, cache, decode_backend=backend, max_batch_size=len(PROMPTS), mixed_steps=True).generate(requests(sampled))


def scripted_logits(model: DeepseekForCausalLM, device: str = "cpu") -> list[torch.Tensor]:
    """The logits of every step of `STEPS` on a fresh float32 cache on `device` (returned on the CPU)."""
    shape = model.config.attention.shape
    cache = PagedLatentCache(NUM_PAGES, PAGE_SIZE, shape.kv_lora_rank, shape.qk_rope_head_dim, dtype="fp32",
                             device=device, num_layers=model.config.num_layers)
    lengths: dict[int, int] = {}
    logits = []
    for step_tokens in STEPS:
        sequences = [seq for seq, _ in step_tokens]
        starts = [lengths.get(seq, 0) for seq in sequences]
        counts = [len(ids) for _, ids in step_tokens]
        step = reserve_step(cache, model.parallel, sequences, starts, counts, heads=shape.num_heads)
        ids = torch.tensor([t for _, tokens in step_tokens for t in tokens], device=device)
        positions = torch.tensor([p for start, n in zip(starts, counts) for p in range(start, start + n)], device=device)
        with torch.no_grad():
            logits.append(model(ids, positions, step, cache).cpu())
        for seq, start, n in zip(sequences, starts, counts):
            lengths[seq] = start + n
    return logits


def run_rank(rank: int, world: int, port: int, out_dir: str, model_dir: str) -> None:
    """One process of the test world: every layout of `LAYOUTS[world]`."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    one_process = scripted_logits(load_model(model_dir))
    results: dict[str, object] = {}
    for tp, dcp, interleave in LAYOUTS[world]:
        groups = init_parallel(ServingConfig(tp_size=tp, dcp_size=dcp, dcp_interleave=interleave))
        model = load_model(model_dir, parallel=groups)
        logits = scripted_logits(model)
        results[f"tp{tp} dcp{dcp}"] = {
            "logit_errs": [(a - b).abs().max().item() for a, b in zip(logits, one_process)],
            "logit_scale": max(b.abs().max().item() for b in one_process),
            "empty_shards": _empty_shards(groups),
            "greedy": generate(model, sampled=False),
            "sampled": generate(model, sampled=True),
            "heads_per_rank": model.config.attention.shape.num_heads,
            "kv_b_rows": model.model.layers[0].self_attn.kv_b_proj.weight.shape[0],
        }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def run_rank_on_device(rank: int, world: int, port: int, out_dir: str, model_dir: str, device: str, cache_dtype: str,
                       backend: str) -> None:
    """A GPU world over gloo: the layouts of `LAYOUTS[world]`, greedy generation only, `cache_dtype` on `device`."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300)
    )
    results = {}
    for tp, dcp, interleave in LAYOUTS[world]:
        groups = init_parallel(ServingConfig(tp_size=tp, dcp_size=dcp, dcp_interleave=interleave))
        model = load_model(model_dir, device=device, parallel=groups)
        results[f"tp{tp} dcp{dcp}"] = generate(model, sampled=False, device=device, cache_dtype=cache_dtype, backend=backend)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _empty_shards(groups: ParallelGroups) -> int:
    """How many (sequence, step) of the scripted steps, and prompts, leave this rank no token of a non-empty sequence."""
    lengths: dict[int, int] = {}
    seen = [len(p) for p in PROMPTS]
    for step_tokens in STEPS:
        for seq, tokens in step_tokens:
            lengths[seq] = lengths.get(seq, 0) + len(tokens)
        seen.extend(lengths.values())
    return sum(groups.sharding.local_length(n, groups.dcp_rank) == 0 for n in seen)
