"""The rank processes of scripts/multi_gpu_run.py's correctness part: one world of `world` ranks
per call, NCCL with one GPU per rank (`cuda:RANK`) or gloo on CPU (its dry run).

    python tests/multi_gpu_worker.py PART WORLD DEVICE OUT_DIR [--model-dir D --model-heads H --model-layers L]

PART is one of:

- `attention`: tests/dcp_worker.py's scenarios (decode, verify, ragged extend, bf16 and fp32
  caches) and collectives under every layout of `layouts(WORLD)`, each rank against the
  one-process oracle it computes itself;
- `model`: a random DeepSeek-V3-shaped model (`mlakit.bench.generation.large_model_config`,
  float32 weights and cache) under every layout: tests/tp_worker.py's scripted steps (prefill,
  decode, extend on a cached prefix, mixed) and its greedy and sampled generation, each
  against the same model in one process on this rank's device;
- `graph`: TP=DCP=WORLD: a DCP decode step (`dcp_decode_step` + `dcp_attention`) captured in a
  CUDA graph, replayed with grown lengths, against eager runs and one-device `mla_decode`
  over a cache holding every token (on CPU the eager step only: no graphs there).

Each rank writes `OUT_DIR/rank{r}.json`; the script judges them. Run as a file, the module
imports itself under its own name, so the rank functions pickle as `multi_gpu_worker.*`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from dcp_worker import SCENARIOS, _collectives, _run_scenario, run_world
from mlakit import PagedLatentCache, ServingConfig, mla_decode
from mlakit.distributed import TokenSharding, dcp_attention, dcp_decode_step, init_parallel
from mlakit.distributed.groups import NO_MULTICAST
from mlakit.serving.graphs import capture_graph
from mlakit.model.deepseek import DeepseekForCausalLM
from mlakit.model.loader import load_model
from tp_worker import generate, scripted_logits

DCP_SIZES = (1, 2, 4, 8)
MODEL_INTERLEAVE = {1: 1, 2: 3, 4: 2, 8: 1}  # divisors of tp_worker.PAGE_SIZE (6)
GRAPH_LENGTHS = (300, 1, 77)
GRAPH_GROWTH = (0, 5)
GRAPH_HEADS_PER_RANK = 16  # DeepSeek-V3's 128 heads at TP8
GRAPH_INTERLEAVE = 16
GRAPH_PAGE_SIZE = 64
TIMEOUT = datetime.timedelta(seconds=300)


def layouts(world: int) -> list[tuple[int, int]]:
    """(tp_size, dcp_size) of a world: TP over every rank, alone and with each DCP size dividing it.

    >>> layouts(2), layouts(8)
    ([(2, 1), (2, 2)], [(8, 1), (8, 2), (8, 4), (8, 8)])
    """
    return [(world, dcp) for dcp in DCP_SIZES if dcp <= world and world % dcp == 0]


def join(rank: int, world: int, port: int, device: str) -> str:
    """Joins the world (NCCL on GPU `rank` for device "cuda", else gloo) with NVLink multicast
    off; returns this rank's device."""
    for name, value in NO_MULTICAST.items():
        os.environ.setdefault(name, value)
    init = f"tcp://127.0.0.1:{port}"
    if device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT,
                                device_id=torch.device("cuda", rank))
        return f"cuda:{rank}"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    return "cpu"


def _write_report(out_dir: str, rank: int, report: dict) -> None:
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def run_attention_rank(rank: int, world: int, port: int, out_dir: str, device: str) -> None:
    """dcp_worker's scenarios and collectives under every layout (bf16 scenarios on triton on GPUs)."""
    where = torch.device(join(rank, world, port, device))
    backend = "triton" if where.type == "cuda" else "reference"
    report: dict[str, object] = {}
    for tp, dcp in layouts(world):
        for scenario in SCENARIOS:
            groups = init_parallel(ServingConfig(tp_size=tp, dcp_size=dcp, dcp_interleave=scenario.interleave))
            report[f"tp{tp} dcp{dcp}: {scenario.name}"] = _run_scenario(groups, scenario, where, backend)
        report[f"tp{tp} dcp{dcp}: collectives"] = _collectives(groups, where)
    _write_report(out_dir, rank, report)


def _generations(model: DeepseekForCausalLM, device: str) -> dict[str, list[list[int]]]:
    return {kind: generate(model, sampled=kind == "sampled", device=device, cache_dtype="fp32")
            for kind in ("greedy", "sampled")}


def run_model_rank(rank: int, world: int, port: int, out_dir: str, device: str, model_dir: str) -> None:
    """Every layout's scripted logits and generations against the whole model on this rank's device."""
    where = join(rank, world, port, device)
    alone = load_model(model_dir, device=where)
    want_logits, want_tokens = scripted_logits(alone, where), _generations(alone, where)
    scale = max(float(x.abs().max()) for x in want_logits)
    del alone
    report: dict[str, object] = {}
    for tp, dcp in layouts(world):
        groups = init_parallel(ServingConfig(tp_size=tp, dcp_size=dcp, dcp_interleave=MODEL_INTERLEAVE[dcp]))
        model = load_model(model_dir, device=where, parallel=groups)
        logits, tokens = scripted_logits(model, where), _generations(model, where)
        report[f"tp{tp} dcp{dcp}"] = {
            "logit_errs": [float((a - b).abs().max()) for a, b in zip(logits, want_logits)],
            "logit_scale": scale,
            "interleave": MODEL_INTERLEAVE[dcp],
            **{f"{kind}_equal": tokens[kind] == want_tokens[kind] for kind in tokens},
            "tokens": sum(map(len, tokens["greedy"])),
        }
    _write_report(out_dir, rank, report)


def _graph_caches(rows: list[torch.Tensor], sharding: TokenSharding, dcp_rank: int,
                  device: str) -> tuple[PagedLatentCache, PagedLatentCache]:
    """This rank's shard of `rows` (every sequence at its longest) and one cache holding all of them."""
    shard = PagedLatentCache(64, GRAPH_PAGE_SIZE, 512, 64, dtype="bf16", device=device)
    whole = PagedLatentCache(64, GRAPH_PAGE_SIZE, 512, 64, dtype="bf16", device=device)
    for seq, r in enumerate(rows):
        held = sharding.global_position(dcp_rank, torch.arange(sharding.local_length(r.shape[0], dcp_rank)))
        shard.write_slots(shard.reserve(seq, held.numel()), r[held].to(device))
        whole.write_slots(whole.reserve(seq, r.shape[0]), r.to(device))
    return shard, whole


def _capture(step: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`step` run once on the current stream (kernels compiled, NCCL communicators started outside
    the capture), then `capture_graph`: warmed on a side stream, then captured."""
    step()
    return capture_graph(step, warmup=1)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The worst element's `|got - want| / max(|want|, 1)`: bf16 outputs of two exact paths
    differ by a rounding or two, 2^-8 of the value each, whatever its size.

    >>> _error(torch.tensor([4.0, 0.5]), torch.tensor([4.125, 0.25]))
    0.25
    """
    return float(((got.float() - want.float()).abs() / want.float().abs().clamp(min=1)).max())


def run_graph_rank(rank: int, world: int, port: int, out_dir: str, device: str) -> None:
    """TP=DCP=world: the DCP decode step (q_len 2) eager and, on GPUs, captured and replayed with
    grown lengths; every output against eager and one-device `mla_decode` over all tokens (`_error`)."""
    where = join(rank, world, port, device)
    groups = init_parallel(ServingConfig(tp_size=world, dcp_size=world, dcp_interleave=GRAPH_INTERLEAVE))
    backend = "triton" if where.startswith("cuda") else "reference"
    gen = torch.Generator().manual_seed(0)  # every rank makes the same sequences
    rows = [torch.randn(n + max(GRAPH_GROWTH), 576, generator=gen).bfloat16() for n in GRAPH_LENGTHS]
    shard, whole = _graph_caches(rows, groups.sharding, groups.dcp_rank, where)
    seqs = list(range(len(rows)))
    table, whole_table = shard.block_table(seqs, max_pages=8), whole.block_table(seqs, max_pages=8)
    lens = torch.tensor(GRAPH_LENGTHS, dtype=torch.int32, device=where)
    q_gen = torch.Generator().manual_seed(1 + rank)
    q = torch.randn(len(rows) * 2, GRAPH_HEADS_PER_RANK, 576, generator=q_gen).bfloat16().to(where)
    scale = 192**-0.5

    def step_and_attend() -> torch.Tensor:
        step = dcp_decode_step(groups.sharding, groups.dcp_rank, table, lens, q_len=2, page_size=GRAPH_PAGE_SIZE)
        out, _ = dcp_attention(q, shard.data, step, groups.dcp_group, kv_lora_rank=512, softmax_scale=scale,
                               backend=backend, check_inputs=False)
        return out

    def one_device() -> torch.Tensor:
        out, _ = mla_decode(q.view(len(rows), 2, GRAPH_HEADS_PER_RANK, 576), whole.data, whole_table, lens,
                            softmax_scale=scale, backend=backend)
        return out.flatten(0, 1)

    graph, captured = _capture(step_and_attend) if where.startswith("cuda") else (None, None)
    checks = []
    for growth in GRAPH_GROWTH:
        lens.copy_(torch.tensor([n + growth for n in GRAPH_LENGTHS], dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=q_gen).bfloat16())
        eager, alone = step_and_attend(), one_device()
        found = {"growth": growth, "eager_vs_one_device": _error(eager, alone)}
        if graph is not None:
            graph.replay()
            found["replay_vs_eager"] = _error(captured, eager)
            found["replay_vs_one_device"] = _error(captured, alone)
        checks.append(found)
    report = {"checks": checks, "graph": graph is not None, "backend": backend,
              "dcp_rank": groups.dcp_rank, "local_lengths": shard.seq_lens(seqs).tolist()}
    del graph, captured  # a live graph holding NCCL kernels keeps the communicator from shutting down
    if where.startswith("cuda"):
        torch.cuda.synchronize()
    _write_report(out_dir, rank, report)


def write_random_model(directory: Path, heads: int, layers: int) -> Path:
    """A seeded random float32 checkpoint of `large_model_config(layers, heads)` (DeepSeek-V3's
    latent widths 512 + 64, nope 128, v 128; MoE after layer 0), written once (a folder with a
    config.json is taken as written)."""
    if (directory / "config.json").exists():
        return directory
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from mlakit.bench.generation import large_model_config

    torch.manual_seed(0)
    hf = DeepseekV3ForCausalLM(DeepseekV3Config(**large_model_config(layers, heads), dtype=torch.float32))
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.02) if param.dim() > 1 else param.copy_(1 + 0.1 * torch.randn_like(param))
    hf.save_pretrained(directory)
    return directory


def main(argv: list[str]) -> None:
    """Runs one PART world (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("attention", "model", "graph"))
    parser.add_argument("world", type=int)
    parser.add_argument("device", choices=("cuda", "cpu"))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--model-dir", type=Path, default=None, help="the random model's folder (default: OUT_DIR/model)")
    parser.add_argument("--model-heads", type=int, default=128)
    parser.add_argument("--model-layers", type=int, default=4)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    extra: tuple[object, ...] = (args.device,)
    if args.part == "model":
        model_dir = write_random_model(args.model_dir or args.out_dir / "model", args.model_heads, args.model_layers)
        extra += (str(model_dir),)
    target = {"attention": run_attention_rank, "model": run_model_rank, "graph": run_graph_rank}[args.part]
    run_world(args.world, args.out_dir, *extra, target=target)


if __name__ == "__main__":
    import multi_gpu_worker

    multi_gpu_worker.main(sys.argv[1:])
