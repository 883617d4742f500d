#!/usr/bin/env python3
"""The multi-GPU run: TP / DCP correctness and DCP decode scaling on one machine of N >= 2 GPUs,
written as one JSON file (device, versions, date, verdicts) under benchmarks/results/.

    python3 scripts/multi_gpu_run.py [--deadline-s 540 --resume]      # on the GPU machine
    python3 scripts/multi_gpu_run.py --dry-run --gpus 8 --gpu-memory-gib 79.6   # anywhere, no GPU

Correctness, for each world size w in (2, 4, 8) up to N (tests/multi_gpu_worker.py, one
process per rank over NCCL, rank r on GPU r): TP=w alone and with every DCP size dividing w,
(a) DCP attention in decode, verify and extend steps against one process, (b) a random
DeepSeek-V3-shaped model (128 heads, float32 weights and cache): scripted prefill / decode /
extend / mixed steps' logits and greedy and sampled generation against the same model on one
GPU, (c) TP=DCP=w: a DCP decode step captured in a CUDA graph and replayed, against eager and
one-GPU `mla_decode`.

Scaling: the 61-layer DeepSeek-V3 decode attention stack (128 heads in all, latent 512 + 64)
through `mlakit bench decode --graphs` (torchrun, TP = DCP = d, one rank per GPU; d = 1 is one
process) for every context x batch x DCP size whose latent cache fits a GPU, with the time
per step (graph), cache bytes per rank, the collectives' share, and each DCP size's speedup
and cache ratio over one GPU; then the issue's target at 128k context (DCP2 >= 1.7x faster,
<= 0.55x cache bytes per rank). A case that cannot run says why ("not run").

NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are set here and passed to every process started. The JSON file is
rewritten after every piece; `--resume` keeps the pieces of an earlier file that ran, so a
run cut by `--deadline-s` (or a command time limit) goes on where it stopped.

`--dry-run` needs no GPU: it prints the plan (commands, fit decisions) for `--gpus` and
`--gpu-memory-gib` and runs the correctness part at world size 2 over gloo on CPU (tiny model,
reference backend; the CUDA graph is "not run" there); the scaling rows are "not run".
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from mlakit.bench.graphs import MEMORY_FRACTION, GraphBenchSettings  # noqa: E402
from mlakit.distributed.groups import NO_MULTICAST  # noqa: E402
from multi_gpu_worker import layouts  # noqa: E402

CONTEXTS = (32768, 131072, 524288)
BATCHES = (1, 16, 64)
DCP_SIZES = (1, 2, 4, 8)
WORLDS = (2, 4, 8)
PARTS = ("attention", "model", "graph")
HEADS = 128
HEADROOM_BYTES = 2 * 2**30  # beyond the bench's own budget: buffers, workspaces, NCCL
DRY_RUN_MEMORY_GIB = 81559 / 1024  # an H100's 81559 MiB
TARGET = {"context": 131072, "dcp": 2, "min_speedup": 1.7, "max_cache_ratio": 0.55}
LSE_TOL = {"cuda": 1e-3, "cpu": 1e-4}  # as tests/test_distributed_gpu.py and test_distributed_dcp.py
LOGIT_TOL = {"cuda": 1e-4, "cpu": 1e-5}  # x max(|logit|, 1); float32 everywhere, sums in another order
GRAPH_TOL = {"eager_vs_one_device": 2e-2, "replay_vs_eager": 1e-3, "replay_vs_one_device": 2e-2}  # |d| / max(|want|, 1)
KILL_GRACE_S = 30  # SIGTERM lets torchrun end its ranks (their own sessions) before SIGKILL
EXIT_GRACE_S = 60  # a correctness piece whose ranks all reported gets this long to exit
POLL_S = 0.5
HUNG_AT_EXIT = "hung at exit"
RAN, FAILED, NOT_RUN = "ran", "error", "not run"


@dataclasses.dataclass(frozen=True)
class Machine:
    """Where the run happens: the device's name, the GPUs used and one GPU's memory."""

    name: str
    gpus: int
    memory_bytes: int
    dry_run: bool

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"


@dataclasses.dataclass(frozen=True)
class ScalingCase:
    """One context x batch x DCP size: the fullest rank's latent-cache bytes of the batch
    (`cache_bytes`) and what the bench allocates for it (`alloc_bytes`, pages plus a spare)."""

    context: int
    batch: int
    dcp: int
    cache_bytes: int
    alloc_bytes: int
    budget_bytes: int

    @property
    def fits(self) -> bool:
        return self.alloc_bytes + HEADROOM_BYTES <= self.budget_bytes

    @property
    def key(self) -> tuple[int, int, int]:
        return self.context, self.batch, self.dcp


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """One bench command: a context and DCP size, the batches that fit (one graph bucket each)."""

    context: int
    dcp: int
    batches: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a child process ended: its exit status (None when cut), the limit that cut it, its log's end."""

    returncode: int | None
    cut_by: str | None
    tail: str


class Clock:
    """Per-piece time limits: `case_timeout_s`, and no later than `deadline_s` after the start."""

    def __init__(self, case_timeout_s: float, deadline_s: float | None):
        self.case_timeout_s = case_timeout_s
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s

    def limit(self) -> tuple[float, str]:
        """Seconds the next piece may take and what bounds it ("case timeout" or "deadline")."""
        if self.deadline is None or self.deadline - time.monotonic() >= self.case_timeout_s:
            return self.case_timeout_s, "case timeout"
        return max(0.0, self.deadline - time.monotonic()), "deadline"


def child_env() -> dict[str, str]:
    """This environment plus NVLink multicast off, src/ and tests/ importable, unbuffered output."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **NO_MULTICAST, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def worlds_for(gpus: int) -> list[int]:
    """World sizes the correctness part runs on `gpus` GPUs.

    >>> worlds_for(2), worlds_for(6), worlds_for(8)
    ([2], [2, 4], [2, 4, 8])
    """
    return [w for w in WORLDS if w <= gpus]


def plan_scaling(contexts: Iterable[int], batches: Iterable[int], dcp_sizes: Iterable[int], gpu_bytes: int,
                 interleave: int) -> list[ScalingCase]:
    """Every context x batch x DCP size with its cache bytes per rank, from the bench's own settings
    (lengths within +-25% of the context, DCP rank 0 the fullest); the budget is the bench's."""
    cases = []
    for context in contexts:
        for batch in batches:
            for dcp in dcp_sizes:
                settings = GraphBenchSettings(heads=HEADS, context=context, batches=(batch,), tp_size=dcp, dcp_size=dcp,
                                              dcp_interleave=interleave if dcp > 1 else 1)
                held = sum(settings.local_lengths(0))
                cases.append(ScalingCase(context, batch, dcp, settings.layers * held * settings.dim * 2,
                                         settings.cache_bytes(), int(MEMORY_FRACTION * gpu_bytes)))
    return cases


def bench_runs(cases: Iterable[ScalingCase]) -> list[BenchRun]:
    """The fitting cases grouped into one bench command per context and DCP size."""
    grouped: dict[tuple[int, int], list[int]] = {}
    for case in cases:
        if case.fits:
            grouped.setdefault((case.context, case.dcp), []).append(case.batch)
    return [BenchRun(context, dcp, tuple(sorted(b))) for (context, dcp), b in grouped.items()]


def bench_command(run: BenchRun, json_path: Path, steps: int, interleave: int) -> list[str]:
    """`mlakit bench decode --graphs` for `run`: one process at DCP 1, else torchrun with TP = DCP = d."""
    bench = ["-m", "mlakit.bench", "decode", "--graphs", "--graph-heads", str(HEADS), "--graph-context", str(run.context),
             "--graph-batches", ",".join(map(str, run.batches)), "--graph-steps", str(steps), "--json", str(json_path)]
    if run.dcp == 1:
        return [sys.executable, *bench]
    ranks = str(run.dcp)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", ranks, *bench,
            "--tp-size", ranks, "--dcp-size", ranks, "--dcp-interleave", str(interleave)]


def run_command(argv: list[str], log_path: Path, limit: tuple[float, str], finished: Callable[[], bool] | None = None,
                exit_grace_s: float = EXIT_GRACE_S) -> Outcome:
    """Runs `argv` from the repository root with `child_env()`, output to `log_path`, in its own
    process group; past `limit` it gets SIGTERM, then SIGKILL for the group. With `finished` (e.g. every
    rank's report written), a child still alive `exit_grace_s` after it turns true is cut the same way as
    "hung at exit" (a rank that never leaves, e.g. NCCL teardown), instead of holding the run until `limit`."""
    seconds, bound = limit
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT, process_group=0)
        returncode, cut_by = _wait(proc, seconds, bound, finished, exit_grace_s), None
        if returncode is None:
            cut_by = bound if finished is None or not finished() else HUNG_AT_EXIT
            proc.terminate()
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group: ranks, a forkserver
            except ProcessLookupError:
                pass
            proc.wait()
    return Outcome(returncode, cut_by, "\n".join(log_path.read_text(errors="replace").splitlines()[-15:]))


def _wait(proc: subprocess.Popen, seconds: float, bound: str, finished: Callable[[], bool] | None,
          exit_grace_s: float) -> int | None:
    """The child's exit status, or None when `seconds` pass, or `exit_grace_s` after `finished()` turns true."""
    if finished is None:
        try:
            return proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None
    end, finished_at = time.monotonic() + seconds, None
    while (returncode := proc.poll()) is None:
        now = time.monotonic()
        if finished_at is None and finished():
            finished_at = now
        if now >= end or (finished_at is not None and now - finished_at >= exit_grace_s):
            return None
        time.sleep(POLL_S)
    return returncode


def not_run(reason: str, **fields: object) -> dict[str, object]:
    return {"status": NOT_RUN, "reason": reason, **fields}


def failure(outcome: Outcome, seconds: float) -> dict[str, object] | None:
    """The status of a child that did not exit 0: "not run" when the deadline cut it (`--resume`
    reruns it), else an error with its log's end; None when it exited 0."""
    if outcome.cut_by == "deadline":
        return not_run(f"cut at the --deadline-s limit after {seconds:.0f} s; rerun with --resume")
    if outcome.cut_by == HUNG_AT_EXIT:
        return {"status": FAILED, "reason": f"every rank wrote its report, but the processes did not exit (cut after "
                                            f"{seconds:.0f} s)", "log_tail": outcome.tail}
    if outcome.cut_by is not None:
        return {"status": FAILED, "reason": f"timed out after {seconds:.0f} s", "log_tail": outcome.tail}
    if outcome.returncode != 0:
        return {"status": FAILED, "reason": f"exit status {outcome.returncode}", "log_tail": outcome.tail}
    return None


# ---------------------------------------------------------------------------------------------- correctness


def summarize_attention(reports: list[dict], device: str) -> dict[str, object]:
    """Every case's worst errors over the ranks against its tolerances and the cache checks."""
    cases, failed = {}, []
    for name in reports[0]:
        found = [r[name] for r in reports]
        if name.endswith(": collectives"):
            ok = all(f["gather_err"] == 0 and f["merge_out_err"] <= 1e-6 and f["merge_lse_err"] <= 1e-6
                     and f["merge_lse_inf_match"] and f["unseen_query_zero"] for f in found)
            cases[name] = {"pass": ok, **{k: max(f[k] for f in found) for k in ("gather_err", "merge_out_err", "merge_lse_err")}}
        else:
            out_err, lse_err = max(f["out_err"] for f in found), max(f["lse_err"] for f in found)
            cache_ok = all(f["slots_match_reserve"] and f["cache_holds_own_tokens"] and f["local_lengths_match_cache"]
                           for f in found)
            ok = out_err <= found[0]["out_tol"] and lse_err <= LSE_TOL[device] and cache_ok
            cases[name] = {"pass": ok, "out_err": out_err, "out_tol": found[0]["out_tol"], "lse_err": lse_err,
                           "lse_tol": LSE_TOL[device], "cache_checks": cache_ok}
        if not cases[name]["pass"]:
            failed.append(name)
    errors = [c for c in cases.values() if "out_err" in c]
    return {"status": "fail" if failed else "pass", "failed": failed, "max_out_err": max(c["out_err"] for c in errors),
            "max_lse_err": max(c["lse_err"] for c in errors), "cases": cases}


def summarize_model(reports: list[dict], device: str) -> dict[str, object]:
    """Each layout's worst logit error over the scripted steps and ranks, and whether every rank's
    greedy and sampled tokens are the one-GPU tokens."""
    layouts_found, failed = {}, []
    for name in reports[0]:
        found = [r[name] for r in reports]
        err, scale = max(max(f["logit_errs"]) for f in found), found[0]["logit_scale"]
        tol = LOGIT_TOL[device] * max(scale, 1.0)
        greedy, sampled = all(f["greedy_equal"] for f in found), all(f["sampled_equal"] for f in found)
        ok = err <= tol and greedy and sampled
        layouts_found[name] = {"pass": ok, "max_logit_err": err, "logit_tol": tol, "greedy_tokens_equal": greedy,
                               "sampled_tokens_equal": sampled, "tokens_per_generation": found[0]["tokens"],
                               "dcp_interleave": found[0]["interleave"]}
        if not ok:
            failed.append(name)
    return {"status": "fail" if failed else "pass", "failed": failed,
            "max_logit_err": max(v["max_logit_err"] for v in layouts_found.values()), "layouts": layouts_found}


def summarize_graph(reports: list[dict], device: str) -> dict[str, object]:
    """The worst error of each comparison over ranks and replays against `GRAPH_TOL`; without
    graphs (CPU) only the eager step was checked, and the part is "not run"."""
    checks = [c for r in reports for c in r["checks"]]
    worst = {k: max(c[k] for c in checks) for k in GRAPH_TOL if k in checks[0]}
    ok = all(worst[k] <= GRAPH_TOL[k] for k in worst)
    summary = {"max_errors": worst, "tolerances": GRAPH_TOL, "backend": reports[0]["backend"],
               "replays": len(reports[0]["checks"]), "eager_step_pass": worst["eager_vs_one_device"] <= GRAPH_TOL["eager_vs_one_device"]}
    if not reports[0]["graph"]:
        return not_run(f"CUDA graphs need a CUDA device ({device}); the eager DCP step ran and was checked", **summary)
    return {"status": "pass" if ok else "fail", **summary}


SUMMARIES: dict[str, Callable[[list[dict], str], dict[str, object]]] = {
    "attention": summarize_attention, "model": summarize_model, "graph": summarize_graph,
}


def world_part_command(part: str, world: int, device: str, work_dir: Path, model: tuple[int, int]) -> list[str]:
    """The worker command of one correctness piece (reports in `work_dir/world{w}-{part}`; the
    random model of `model` = (heads, layers) written once under `work_dir`)."""
    command = [sys.executable, str(ROOT / "tests" / "multi_gpu_worker.py"), part, str(world), device,
               str(work_dir / f"world{world}-{part}")]
    if part != "model":
        return command
    heads, layers = model
    return command + ["--model-dir", str(work_dir / f"model-h{heads}-l{layers}"), "--model-heads", str(heads),
                      "--model-layers", str(layers)]


def run_world_part(part: str, world: int, machine: Machine, work_dir: Path, clock: Clock, model: tuple[int, int]) -> dict:
    """One correctness piece in a child process; its ranks' reports judged by `SUMMARIES[part]`."""
    out_dir = work_dir / f"world{world}-{part}"
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.json"):
        stale.unlink()
    limit = clock.limit()
    if limit[0] <= 0:
        return not_run("the --deadline-s limit was reached before it started; rerun with --resume")
    began = time.monotonic()

    def reports_written() -> bool:
        return all((out_dir / f"rank{r}.json").exists() for r in range(world))

    outcome = run_command(world_part_command(part, world, machine.device, work_dir, model), out_dir / "log.txt", limit,
                          reports_written)
    bad = failure(outcome, time.monotonic() - began)
    if bad is not None:
        return bad
    reports = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]
    return {**SUMMARIES[part](reports, machine.device), "seconds": round(time.monotonic() - began, 1)}


def correctness_passed(worlds: dict[str, dict[str, dict]]) -> bool | None:
    """True when every piece passed, False when one failed or broke, None while some did not run.

    >>> correctness_passed({"2": {"attention": {"status": "pass"}, "graph": {"status": "not run"}}})
    >>> correctness_passed({"2": {"attention": {"status": "fail"}, "graph": {"status": "not run"}}})
    False
    """
    statuses = {piece["status"] for parts in worlds.values() for piece in parts.values()}
    if statuses & {"fail", FAILED}:
        return False
    return None if NOT_RUN in statuses or not statuses else True


# ---------------------------------------------------------------------------------------------- scaling


def case_row(case: ScalingCase, command: list[str] | None) -> dict[str, object]:
    """A scaling row before it runs: the plan, and "not run" with why where it cannot run."""
    row: dict[str, object] = {
        "context": case.context, "batch": case.batch, "dcp": case.dcp, "tp": case.dcp, "gpus": case.dcp,
        "cache_bytes_per_rank": case.cache_bytes, "alloc_bytes_per_rank": case.alloc_bytes,
        "budget_bytes": case.budget_bytes, "fits": case.fits, "command": shlex.join(command) if command else None,
    }
    if case.fits:
        row.update(not_run("planned, not run yet"))
    else:
        row.update(not_run(f"the rank's caches ({case.alloc_bytes / 1e9:.1f} GB) plus {HEADROOM_BYTES / 2**30:.0f} GiB "
                           f"headroom exceed the bench's budget ({case.budget_bytes / 1e9:.1f} GB, "
                           f"{MEMORY_FRACTION:.0%} of one GPU)"))
    return row


def measured(result: dict) -> dict[str, object]:
    """A scaling row's measurements from one batch of the bench's JSON (`GraphBatchResult.to_json`)."""
    comm = result.get("comm")
    return {
        "status": RAN if result["ok"] else FAILED,
        **({} if result["ok"] else {"reason": f"graph output differs from eager (relative error {result['rel_error']:.1e})"}),
        "graph_ms": result["graph"]["median_ms"], "replay_ms": result["replay"]["median_ms"],
        "eager_ms": result["eager"]["median_ms"], "comm_ms": comm["median_ms"] if comm else None,
        "comm_share": result["comm_share"], "comm_bytes_per_rank": result["comm_bytes"], "graph_rel_error": result["rel_error"],
        "kv_gb_per_s": result["kv_gb_per_s"],
    }


def bench_json(work_dir: Path, run: BenchRun) -> Path:
    return work_dir / f"c{run.context}-dcp{run.dcp}.json"


def settle(row: dict, fields: dict[str, object]) -> None:
    """Replaces a row's status (and its reason, log) with `fields`."""
    for name in ("status", "reason", "log_tail"):
        row.pop(name, None)
    row.update(fields)


def run_bench(run: BenchRun, rows: dict[tuple[int, int, int], dict], work_dir: Path, clock: Clock, steps: int,
              interleave: int) -> None:
    """Runs one bench command and fills its batches' rows from its JSON (or why it gave none)."""
    json_path = bench_json(work_dir, run)
    json_path.unlink(missing_ok=True)
    keys = [(run.context, b, run.dcp) for b in run.batches]
    limit = clock.limit()
    if limit[0] <= 0:
        for key in keys:
            settle(rows[key], not_run("the --deadline-s limit was reached before it started; rerun with --resume"))
        return
    began = time.monotonic()
    outcome = run_command(bench_command(run, json_path, steps, interleave), json_path.with_suffix(".log"), limit)
    bad = failure(outcome, time.monotonic() - began)
    results = {r["batch"]: r for r in json.loads(json_path.read_text())["results"]} if json_path.exists() else {}
    for key in keys:
        if key[1] in results:
            settle(rows[key], measured(results[key[1]]))
        else:
            settle(rows[key], bad or {"status": FAILED, "reason": f"no result for batch {key[1]} in {json_path}"})


def add_ratios(rows: list[dict]) -> None:
    """Each row's cache bytes per rank over one GPU's at the same context and batch, and one GPU's
    time per step (graph) over its own where both ran."""
    alone = {(r["context"], r["batch"]): r for r in rows if r["dcp"] == 1}
    for row in rows:
        base = alone.get((row["context"], row["batch"]))
        row["cache_ratio_vs_1gpu"] = row["cache_bytes_per_rank"] / base["cache_bytes_per_rank"] if base else None
        both = base is not None and base.get("status") == RAN and row.get("status") == RAN
        row["speedup_vs_1gpu"] = base["graph_ms"] / row["graph_ms"] if both else None


def target_verdicts(rows: list[dict]) -> list[dict[str, object]]:
    """The issue's target per batch at TARGET's context: DCP2 at least `min_speedup` times one GPU's
    speed and at most `max_cache_ratio` of its cache bytes per rank; why where it falls short."""
    verdicts = []
    for row in rows:
        if row["context"] != TARGET["context"] or row["dcp"] != TARGET["dcp"] or row["cache_ratio_vs_1gpu"] is None:
            continue
        alone = next(r for r in rows if (r["context"], r["batch"], r["dcp"]) == (row["context"], row["batch"], 1))
        cache_met = row["cache_ratio_vs_1gpu"] <= TARGET["max_cache_ratio"]
        verdict = {"context": row["context"], "batch": row["batch"], "dcp": row["dcp"], **TARGET,
                   "cache_ratio": row["cache_ratio_vs_1gpu"], "cache_met": cache_met, "speedup": row["speedup_vs_1gpu"]}
        if row["speedup_vs_1gpu"] is None:
            missing = alone if alone.get("status") != RAN else row
            why = f"DCP{missing['dcp']} {missing.get('status', NOT_RUN)}: {missing.get('reason', 'not run yet')}"
            verdicts.append({**verdict, "speedup_met": None, "verdict": NOT_RUN, "why": why})
            continue
        speedup_met = row["speedup_vs_1gpu"] >= TARGET["min_speedup"]
        met = speedup_met and cache_met
        verdicts.append({**verdict, "speedup_met": speedup_met, "verdict": "met" if met else "missed",
                         "why": None if met else shortfall(alone, row)})
    return verdicts


def shortfall(alone: dict, row: dict) -> str:
    """Where the DCP step's time goes against one GPU's: the collectives, the graph launch, the attention.

    >>> print(shortfall({"graph_ms": 10.0, "replay_ms": 9.9}, {"graph_ms": 7.0, "replay_ms": 6.9, "comm_ms": 2.0,
    ...     "dcp": 2, "cache_ratio_vs_1gpu": 0.5}))
    DCP2 step 7.00 ms vs one GPU's 10.00 ms (1.43x); collectives 2.00 ms (29% of the replay); without them 4.90 ms (2.02x over one GPU's replay); cache ratio 0.50
    """
    comm = row.get("comm_ms") or 0.0
    rest = row["replay_ms"] - comm
    return (f"DCP{row['dcp']} step {row['graph_ms']:.2f} ms vs one GPU's {alone['graph_ms']:.2f} ms "
            f"({alone['graph_ms'] / row['graph_ms']:.2f}x); collectives {comm:.2f} ms ({comm / row['replay_ms']:.0%} of the "
            f"replay); without them {rest:.2f} ms ({alone['replay_ms'] / rest:.2f}x over one GPU's replay); "
            f"cache ratio {row['cache_ratio_vs_1gpu']:.2f}")


# ---------------------------------------------------------------------------------------------- machine, file, table


def detect_machine(dry_run: bool, gpus: int | None, memory_gib: float | None) -> Machine:
    """The GPUs here (the first `gpus`; the smallest one's memory unless `memory_gib`), or the dry run's."""
    if dry_run:
        return Machine("dry run (no GPU)", gpus or 8, int((memory_gib or DRY_RUN_MEMORY_GIB) * 2**30), True)
    count = min(gpus or torch.cuda.device_count(), torch.cuda.device_count())
    if count < 2:
        raise click.ClickException(f"needs at least 2 CUDA GPUs, has {count} (found {torch.cuda.device_count()}); "
                                   "--dry-run runs without")
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))  # no CUDA context here
    return Machine(torch.cuda.get_device_name(0), count, int(memory_gib * 2**30) if memory_gib else memory, False)


def environment(machine: Machine) -> dict[str, object]:
    """Device, GPU count and memory, versions and date for the results file."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {
        "device": machine.name, "gpus": machine.gpus, "gpu_memory_bytes": machine.memory_bytes, "dry_run": machine.dry_run,
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl, "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "multicast_off": NO_MULTICAST,
    }


def default_out(machine: Machine, today: datetime.date) -> Path:
    """benchmarks/results/<date>-multi-gpu-<gpus>x<device>.json

    >>> default_out(Machine("NVIDIA H100 80GB HBM3", 8, 1, False), datetime.date(2026, 11, 24)).name
    '2026-11-24-multi-gpu-8xh100.json'
    """
    found = re.search(r"\b[A-Z]+\d{2,4}[A-Z]?\b", machine.name)
    slug = found.group(0).lower() if found else re.sub(r"[^a-z0-9]+", "-", machine.name.lower()).strip("-")
    return ROOT / "benchmarks" / "results" / f"{today.isoformat()}-multi-gpu-{machine.gpus}x{slug}.json"


def previous_pieces(path: Path | None, machine: Machine) -> tuple[dict[str, dict], dict[tuple[int, int, int], dict]]:
    """An earlier file's correctness pieces and the scaling rows that ran (for `--resume`)."""
    if path is None or not path.exists():
        return {}, {}
    data = json.loads(path.read_text())
    if data["environment"]["device"] != machine.name:
        raise click.ClickException(f"--resume: {path} was written on {data['environment']['device']}, this is {machine.name}")
    rows = {(r["context"], r["batch"], r["dcp"]): r for r in data["scaling"]["rows"] if r.get("status") in (RAN, FAILED)}
    return data["correctness"]["worlds"], rows


def results(env: dict, settings: dict, worlds: dict[str, dict], machine: Machine, rows: list[dict]) -> dict[str, object]:
    """The results file: environment, settings, correctness, scaling rows (with ratios) and the target."""
    add_ratios(rows)
    correctness = {"process_group": "gloo" if machine.dry_run else "nccl", "device": machine.device,
                   "passed": correctness_passed(worlds), "worlds": worlds}
    return {"environment": env, "settings": settings, "correctness": correctness, "scaling": {"rows": rows},
            "targets": target_verdicts(rows)}


def run_settings(model: tuple[int, int], interleave: int, steps: int, work_dir: Path) -> dict[str, object]:
    """What the run used: the bench's stack, the random model, the budget and the target."""
    return {"layers": 61, "heads": HEADS, "kv_lora_rank": 512, "rope_dim": 64, "page_size": 64, "kv_dtype": "bf16",
            "dcp_interleave": interleave, "steps": steps, "memory_fraction": MEMORY_FRACTION, "headroom_bytes": HEADROOM_BYTES,
            "random_model": {"heads": model[0], "layers": model[1], "dtype": "float32"}, "work_dir": str(work_dir),
            "target": TARGET}


def correctness_lines(worlds: dict[str, dict]) -> list[str]:
    lines = []
    for world, parts in worlds.items():
        for part, piece in parts.items():
            errors = {k: v for k, v in piece.items() if k.startswith("max_") and isinstance(v, float)}
            errors.update(piece.get("max_errors", {}))
            detail = ", ".join(f"{k.removeprefix('max_')} {v:.1e}" for k, v in errors.items())
            extra = piece.get("reason") or (f"failed: {piece['failed']}" if piece.get("failed") else "")
            lines.append(f"world {world:>2} {part:<9} {piece['status']:<7} {detail}{'; ' if detail and extra else ''}{extra}")
            lines.extend("    " + line for line in piece.get("log_tail", "").splitlines())
    return lines


def scaling_lines(rows: list[dict]) -> list[str]:
    lines = [f"{'context':>8} {'batch':>5} {'dcp':>3} {'cache GB/rank':>13} {'x 1 GPU':>7} {'fits':>4} {'graph ms':>9} "
             f"{'replay ms':>9} {'comm %':>6} {'speedup':>7}  status"]

    def num(value: object, spec: str) -> str:
        return format(value, spec) if isinstance(value, float) else "-"

    for r in rows:
        share = r.get("comm_share")
        lines.append(
            f"{r['context']:>8} {r['batch']:>5} {r['dcp']:>3} {r['cache_bytes_per_rank'] / 1e9:>13.2f} "
            f"{num(r['cache_ratio_vs_1gpu'], '.2f'):>7} {'yes' if r['fits'] else 'no':>4} {num(r.get('graph_ms'), '.3f'):>9} "
            f"{num(r.get('replay_ms'), '.3f'):>9} {num(100 * share if share is not None else None, '.0f'):>6} "
            f"{num(r['speedup_vs_1gpu'], '.2f'):>7}  {r.get('status', 'planned')}"
            f"{': ' + r['reason'] if r.get('reason') and r.get('status') != RAN else ''}"
        )
    return lines


def target_lines(verdicts: list[dict]) -> list[str]:
    lines = []
    for v in verdicts:
        speed = f"{v['speedup']:.2f}x" if v["speedup"] is not None else "-"
        lines.append(f"target {v['context']} tokens, batch {v['batch']}, DCP{v['dcp']}: speedup {speed} "
                     f"(>= {v['min_speedup']}), cache {v['cache_ratio']:.2f}x (<= {v['max_cache_ratio']}): "
                     f"{v['verdict']}{' (' + v['why'] + ')' if v['why'] else ''}")
    return lines or [f"target: no DCP{TARGET['dcp']} row at {TARGET['context']} tokens planned"]


def print_plan(machine: Machine, worlds: list[int], rows: list[dict], runs: dict[BenchRun, list[str]], work_dir: Path,
               model: tuple[int, int]) -> None:
    """The correctness commands, each scaling case's fit decision and the bench commands."""
    click.echo(f"{machine.name}: {machine.gpus} GPUs of {machine.memory_bytes / 2**30:.1f} GiB; bench budget "
               f"{MEMORY_FRACTION:.0%} of that, less {HEADROOM_BYTES / 2**30:.0f} GiB headroom; multicast off: {NO_MULTICAST}")
    for world in worlds:
        click.echo(f"correctness, world {world}, (tp, dcp) layouts {layouts(world)}:")
        for part in PARTS:
            click.echo("  " + shlex.join(world_part_command(part, world, machine.device, work_dir, model)))
    click.echo("scaling, caches per rank (the bench's allocation):")
    for row in rows:
        click.echo(f"  context {row['context']:>6} batch {row['batch']:>2} DCP{row['dcp']}: "
                   f"{row['alloc_bytes_per_rank'] / 1e9:7.1f} GB, {'fits' if row['fits'] else 'does not fit'}")
    click.echo("scaling, bench commands:")
    for command in runs.values():
        click.echo("  " + shlex.join(command))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dry-run", is_flag=True, help="No GPU: print the plan, run the correctness part on CPU (gloo, world 2).")
@click.option("--gpus", type=int, default=None, help="GPUs to use (default: all; dry run: 8).")
@click.option("--gpu-memory-gib", type=float, default=None,
              help=f"One GPU's memory for the fit decisions (default: the device's; dry run: {DRY_RUN_MEMORY_GIB:.1f}).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Results JSON (default: benchmarks/results/<date>-multi-gpu-<gpus>x<device>.json; dry run: none).")
@click.option("--resume", is_flag=True, help="Keep the pieces of an existing --out that ran; run the rest.")
@click.option("--deadline-s", type=float, default=None, help="Start nothing after this many seconds; cut a piece still running.")
@click.option("--case-timeout-s", type=float, default=900.0, show_default=True, help="Limit of one piece (bench run, world).")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="Logs, rank reports and bench JSON files (default: a new folder under /tmp).")
@click.option("--contexts", default=",".join(map(str, CONTEXTS)), show_default=True)
@click.option("--batches", default=",".join(map(str, BATCHES)), show_default=True)
@click.option("--dcp-sizes", default=",".join(map(str, DCP_SIZES)), show_default=True, help="Those above --gpus are dropped.")
@click.option("--dcp-interleave", type=int, default=1, show_default=True, help="Scaling: tokens dealt to a DCP rank at a time.")
@click.option("--steps", type=int, default=100, show_default=True, help="Scaling: timed steps per measurement.")
@click.option("--skip-correctness", is_flag=True)
@click.option("--skip-scaling", is_flag=True)
def main(dry_run: bool, gpus: int | None, gpu_memory_gib: float | None, out: Path | None, resume: bool,
         deadline_s: float | None, case_timeout_s: float, work_dir: Path | None, contexts: str, batches: str,
         dcp_sizes: str, dcp_interleave: int, steps: int, skip_correctness: bool, skip_scaling: bool) -> None:
    """TP / DCP correctness and DCP decode scaling on this machine's GPUs (see the module docstring)."""
    os.environ.update(NO_MULTICAST)
    machine = detect_machine(dry_run, gpus, gpu_memory_gib)
    if out is None and not dry_run:
        out = default_out(machine, datetime.date.today())
    work_dir = work_dir or Path(tempfile.mkdtemp(prefix="mlakit-multi-gpu-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    model = (16, 2) if dry_run else (HEADS, 4)  # (heads, layers) of the random model
    sizes = [d for d in _ints(dcp_sizes) if d <= machine.gpus]
    cases = plan_scaling(_ints(contexts), _ints(batches), sizes, machine.memory_bytes, dcp_interleave)
    runs = {r: bench_command(r, bench_json(work_dir, r), steps, dcp_interleave) for r in bench_runs(cases)}
    commands = {(r.context, b, r.dcp): command for r, command in runs.items() for b in r.batches}
    done_worlds, done_rows = previous_pieces(out if resume else None, machine)
    rows = {c.key: done_rows.get(c.key) or case_row(c, commands.get(c.key)) for c in cases}
    worlds = [] if skip_correctness else [2] if dry_run else worlds_for(machine.gpus)
    print_plan(machine, worlds, list(rows.values()), runs, work_dir, model)
    env = environment(machine)
    settings = run_settings(model, dcp_interleave, steps, work_dir)
    clock = Clock(case_timeout_s, deadline_s)
    found = {str(w): {p: not_run("planned, not run yet") for p in PARTS} for w in worlds}
    for world, parts in done_worlds.items():
        found.setdefault(world, {}).update(parts)

    def save() -> dict[str, object]:
        data = results(env, settings, found, machine, list(rows.values()))
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(data, indent=1))
        return data

    for world in worlds:
        for part in PARTS:
            if found[str(world)][part]["status"] == NOT_RUN:
                click.echo(f"correctness: world {world} {part} ...")
                found[str(world)][part] = run_world_part(part, world, machine, work_dir, clock, model)
                save()
    for run in [] if skip_scaling else runs:
        if dry_run:
            for batch in run.batches:
                settle(rows[run.context, batch, run.dcp], not_run("dry run: no GPU"))
        elif any((run.context, batch, run.dcp) not in done_rows for batch in run.batches):
            click.echo(f"scaling: context {run.context} DCP{run.dcp} batches {run.batches} ...")
            run_bench(run, rows, work_dir, clock, steps, dcp_interleave)
        save()
    data = save()
    for line in [*correctness_lines(found), "", *scaling_lines(data["scaling"]["rows"]), "", *target_lines(data["targets"])]:
        click.echo(line)
    click.echo(f"logs and rank reports: {work_dir}" + (f"; wrote {out}" if out else ""))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


if __name__ == "__main__":
    main()
