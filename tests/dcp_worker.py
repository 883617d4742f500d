"""The rank processes of the DCP tests (tests/test_distributed_dcp.py): gloo on CPU, tiny shapes.

Every rank makes the same random sequences and queries, computes the one-process result
itself (the torch oracle over one cache holding every token), fills its own cache with its
shard the way an engine would (prefix rows by `TokenSharding.global_position`, the step's new
rows through `DCPStep.slots`), runs `dcp_attention` for its TP heads and writes what it found
to `rank{r}.json`; the tests read the files. A worker that raises fails the whole run.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import multiprocessing
import os
import socket
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mlakit import ConfigError, PagedLatentCache, ServingConfig
from mlakit.distributed import (
    ParallelGroups,
    dcp_attention,
    dcp_decode_step,
    dcp_step,
    gather_heads,
    init_parallel,
    merge_across_ranks,
)
from mlakit.reference import merge_attention_states, reference_decode, reference_extend

HEADS_PER_RANK = 2
KV_LORA_RANK = 32
ROPE_DIM = 16
DIM = KV_LORA_RANK + ROPE_DIM
SOFTMAX_SCALE = 0.15
NUM_PAGES = 64


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One step: sequences with `prefixes[b]` cached tokens gain `new[b]` tokens. `decode`: the
    step is built by `dcp_decode_step` (uniform counts); `cache_dtype` fp32 is the exact path,
    bf16 runs `mla_decode` on the reference backend."""

    name: str
    prefixes: tuple[int, ...]
    new: tuple[int, ...]
    interleave: int
    page_size: int
    cache_dtype: str
    decode: bool
    out_tol: float

    @property
    def lengths(self) -> list[int]:
        return [p + n for p, n in zip(self.prefixes, self.new)]


SCENARIOS = (
    Scenario("decode q_len 1, interleave 1, fp32", (0, 1, 4, 8, 16), (1,) * 5, 1, 4, "fp32", True, 1e-5),
    Scenario("verify q_len 3, interleave 4, fp32", (0, 3, 10, 19), (3,) * 4, 4, 8, "fp32", True, 1e-5),
    Scenario("extend ragged, interleave 2, fp32", (0, 5, 11, 3, 0), (4, 1, 7, 0, 0), 2, 4, "fp32", False, 1e-5),
    Scenario("extend, interleave 3, bf16 reference backend", (2, 0, 9), (5, 3, 2), 3, 6, "bf16", False, 2e-2),
    Scenario("decode q_len 2, interleave 1, bf16 reference backend", (1, 6, 13), (2,) * 3, 1, 4, "bf16", True, 2e-2),
)
LAYOUTS = {2: ((2, 2), (2, 1)), 4: ((4, 4), (4, 2))}  # world size -> (tp_size, dcp_size) layouts
PORT_ATTEMPTS = 3


def run_world(world: int, out_dir: Path, *args: object, target: Callable[..., None] | None = None) -> list[dict]:
    """Starts `world` processes running `target(rank, world, port, out_dir, *args)` (default
    `run_rank`), forked from a forkserver that has torch and mlakit imported (a fresh interpreter
    per rank costs seconds), and returns the report each wrote to `out_dir/rank{r}.json`."""
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "mlakit", "mlakit.distributed", "dcp_worker"])
    for attempt in range(PORT_ATTEMPTS):
        try:
            mp.start_processes(target or run_rank, args=(world, _unused_port(), str(out_dir), *args), nprocs=world,
                               start_method="forkserver")
            break
        except mp.ProcessRaisedException as error:
            if "EADDRINUSE" not in str(error) or attempt == PORT_ATTEMPTS - 1:
                raise
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]


def _unused_port() -> int:
    """A port free now; another process may take it before rank 0 listens on it (a run that
    finds it taken, EADDRINUSE, is started again on a new one by `run_world`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_readme_example(rank: int, world: int, port: int, out_dir: str, source: str) -> None:
    """Runs the README's Multi-GPU example as torchrun would start it, then checks its `out` and
    `lse` against one process holding every token (the oracle over the example's own rows)."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    env: dict = {}
    exec(compile(source, "README.md", "exec"), env)
    rank_shape, rows = env["rank"], env["rows"]
    oracle = PagedLatentCache(16, 64, rank_shape.kv_lora_rank, rank_shape.qk_rope_head_dim, dtype="fp32")
    for seq, r in enumerate(rows):
        oracle.write_slots(oracle.reserve(seq, r.shape[0]), r.bfloat16().float())
    seqs = list(range(len(rows)))
    want_out, want_lse = reference_decode(
        env["q"].float()[:, None], oracle.data, oracle.block_table(seqs), oracle.seq_lens(seqs),
        kv_lora_rank=rank_shape.kv_lora_rank, softmax_scale=rank_shape.softmax_scale,
    )
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({
            "out_shape": list(env["out"].shape),
            "out_err": (env["out"].float() - want_out[:, 0]).abs().max().item(),
            "lse_err": (env["lse"] - want_lse[..., 0]).abs().max().item(),
        }, f)
    dist.destroy_process_group()


def run_rank(rank: int, world: int, port: int, out_dir: str, device: str = "cpu", backend: str = "reference") -> None:
    """One process of the test world: every layout of `LAYOUTS[world]`, every scenario; the bf16
    scenarios' local attention runs on `backend`."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    results: dict[str, object] = {"config errors": _config_errors(world)}
    for tp, dcp in LAYOUTS[world]:
        for scenario in SCENARIOS:
            groups = init_parallel(ServingConfig(tp_size=tp, dcp_size=dcp, dcp_interleave=scenario.interleave))
            results[f"tp{tp} dcp{dcp}: {scenario.name}"] = _run_scenario(groups, scenario, torch.device(device), backend)
        results[f"tp{tp} dcp{dcp}: collectives"] = _collectives(groups, torch.device(device))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _config_errors(world: int) -> dict[str, str]:
    try:
        init_parallel(ServingConfig(tp_size=2 * world))
        return {"world size": "no error"}
    except ConfigError as exc:
        return {"world size": str(exc)}


def _random(scenario: Scenario, *shape: int, generator: torch.Generator) -> torch.Tensor:
    values = torch.randn(*shape, generator=generator)
    return values.bfloat16().float() if scenario.cache_dtype == "bf16" else values


def _run_scenario(groups: ParallelGroups, s: Scenario, device: torch.device, backend: str) -> dict[str, object]:
    gen = torch.Generator().manual_seed(zlib.crc32(s.name.encode()))
    heads = HEADS_PER_RANK * groups.tp_size
    rows = [_random(s, length, DIM, generator=gen) for length in s.lengths]
    num_tokens = sum(s.new)
    q = _random(s, num_tokens, heads, DIM, generator=gen)
    cu = torch.tensor([0, *torch.tensor(s.new).cumsum(0).tolist()], dtype=torch.int32)
    lengths = torch.tensor(s.lengths, dtype=torch.int32)
    ref_out, ref_lse = _one_process(rows, q, cu, lengths, s)

    sharding, d = groups.sharding, groups.dcp_rank
    cache = PagedLatentCache(NUM_PAGES, s.page_size, KV_LORA_RANK, ROPE_DIM, dtype=s.cache_dtype, device=device)
    cache.reserve(-1, groups.rank * s.page_size + 1)  # a different page layout on every rank
    seqs = list(range(len(rows)))
    for b, prefix in enumerate(s.prefixes):
        held = sharding.global_position(d, torch.arange(sharding.local_length(prefix, d)))
        cache.write_slots(cache.reserve(b, held.numel()), rows[b][held].to(device))
    reserved = [cache.reserve(b, sharding.local_length(n, d) - cache.seq_len(b)) for b, n in enumerate(s.lengths)]
    table = cache.block_table(seqs)
    if s.decode:
        step = dcp_decode_step(sharding, d, table, lengths.to(device), q_len=s.new[0], page_size=s.page_size)
    else:
        step = dcp_step(sharding, d, table, lengths.to(device), cu.to(device), num_tokens=num_tokens, page_size=s.page_size)
    cache.write_slots(step.slots, torch.cat([r[p:] for r, p in zip(rows, s.prefixes)]).to(device))

    mine = slice(groups.rank * HEADS_PER_RANK, (groups.rank + 1) * HEADS_PER_RANK)
    q_dtype = torch.float32 if s.cache_dtype == "fp32" else torch.bfloat16
    out, lse = dcp_attention(
        q[:, mine].to(device, q_dtype), cache.data, step, groups.dcp_group,
        kv_lora_rank=KV_LORA_RANK, softmax_scale=SOFTMAX_SCALE, backend=backend,
    )
    return {
        "out_err": (out.float().cpu() - ref_out[:, mine]).abs().max().item(),
        "lse_err": (lse.cpu() - ref_lse[:, mine]).abs().max().item(),
        "out_tol": s.out_tol,
        "slots_match_reserve": step.slots[step.slots >= 0].tolist() == torch.cat(reserved).tolist(),
        "cache_holds_own_tokens": all(_holds_own_tokens(cache, groups, b, rows[b]) for b in seqs),
        "local_lengths_match_cache": step.cache_seqlens.tolist() == [cache.seq_len(b) for b in seqs],
        "empty_shards": sum(n > 0 and sharding.local_length(n, d) == 0 for n in s.lengths),
        "out_dtype": str(out.dtype),
    }


def _one_process(
    rows: list[torch.Tensor], q: torch.Tensor, cu: torch.Tensor, lengths: torch.Tensor, s: Scenario
) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: every token in one float32 cache."""
    cache = PagedLatentCache(NUM_PAGES, s.page_size, KV_LORA_RANK, ROPE_DIM, dtype="fp32")
    for b, r in enumerate(rows):
        cache.write_slots(cache.reserve(b, r.shape[0]), r)
    table = cache.block_table(list(range(len(rows))))
    return reference_extend(q, cache.data, table, lengths, cu, kv_lora_rank=KV_LORA_RANK, softmax_scale=SOFTMAX_SCALE)


def _holds_own_tokens(cache: PagedLatentCache, groups: ParallelGroups, seq: int, rows: torch.Tensor) -> bool:
    """The rank's cache holds exactly the sequence's tokens it owns, in order."""
    local = torch.arange(cache.seq_len(seq))
    pages = torch.tensor(cache.pages_of(seq) or [0], dtype=torch.long)
    slots = pages[local // cache.page_size] * cache.page_size + local % cache.page_size
    stored = cache.dequantized().view(-1, DIM).cpu()[slots]
    expected = rows[groups.sharding.global_position(groups.dcp_rank, local)]
    owned = int((groups.sharding.owner(torch.arange(rows.shape[0]))[0] == groups.dcp_rank).sum())
    return local.numel() == owned and torch.equal(stored, expected)


def _collectives(groups: ParallelGroups, device: torch.device) -> dict[str, float]:
    """gather_heads against the full tensor; merge_across_ranks against merge_attention_states
    folded over every DCP rank's partials, with empty shards (-inf) and a query no rank saw."""
    gen = torch.Generator().manual_seed(7)
    size, d, tokens = groups.dcp_size, groups.dcp_rank, 5
    heads = HEADS_PER_RANK * size
    full = torch.randn(tokens, heads, DIM, generator=gen)
    gathered = gather_heads(full[:, d * HEADS_PER_RANK:(d + 1) * HEADS_PER_RANK].to(device), groups.dcp_group).cpu()
    partial_out = torch.randn(size, tokens, heads, KV_LORA_RANK, generator=gen)
    partial_lse = torch.randn(size, tokens, heads, generator=gen) * 3
    partial_lse[torch.rand(size, tokens, heads, generator=gen) < 0.3] = float("-inf")
    partial_lse[:, 0, :] = float("-inf")
    partial_out[partial_lse == float("-inf")] = 0
    out, lse = (t.cpu() for t in merge_across_ranks(partial_out[d].to(device), partial_lse[d].to(device), groups.dcp_group))
    mine = slice(d * HEADS_PER_RANK, (d + 1) * HEADS_PER_RANK)
    want_out, want_lse = partial_out[0, :, mine], partial_lse[0, :, mine]
    for j in range(1, size):
        want_out, want_lse = merge_attention_states(want_out, want_lse, partial_out[j, :, mine], partial_lse[j, :, mine])
    finite = torch.isfinite(want_lse)
    return {
        "gather_err": (gathered - full).abs().max().item(),
        "merge_out_err": (out - want_out).abs().max().item(),
        "merge_lse_err": (lse[finite] - want_lse[finite]).abs().max().item(),
        "merge_lse_inf_match": bool(torch.equal(torch.isfinite(lse), finite)),
        "unseen_query_zero": bool((out[0] == 0).all()),
    }
