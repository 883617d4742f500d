"""scripts/multi_gpu_run.py without GPUs: its pure parts (worlds, grid and fit decisions, bench
commands, the bench JSON's rows, ratios and target verdicts, the correctness summaries, the
results file) and its dry run (the plan, and the correctness part over gloo on CPU at world 2)."""

from __future__ import annotations

import doctest
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlakit.bench.graphs import GraphBatchResult, GraphBenchSettings, StepTime, results_json

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("multi_gpu_run", ROOT / "scripts" / "multi_gpu_run.py")
run_script = sys.modules.setdefault("multi_gpu_run", importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(run_script)

H100_BYTES = 81559 * 2**20
H200_BYTES = 143771 * 2**20


def _cases(gpu_bytes: int, **kwargs) -> dict:
    grid = {"contexts": run_script.CONTEXTS, "batches": run_script.BATCHES, "dcp_sizes": run_script.DCP_SIZES, **kwargs}
    cases = run_script.plan_scaling(grid["contexts"], grid["batches"], grid["dcp_sizes"], gpu_bytes, 1)
    return {c.key: c for c in cases}


def _bench_result(batch: int, graph_ms: float, comm_ms: float | None = None, error: float = 0.0) -> GraphBatchResult:
    comm = None if comm_ms is None else StepTime(comm_ms, comm_ms, 100)
    return GraphBatchResult(batch, 61, batch * 131072, 0, error, StepTime(graph_ms + 5, graph_ms + 5, 100),
                            StepTime(graph_ms, graph_ms, 100), StepTime(graph_ms - 0.05, graph_ms - 0.05, 100), comm, 10**6)


def test_docstring_examples():
    assert doctest.testmod(run_script).failed == 0


def test_worlds_and_layouts():
    assert run_script.worlds_for(2) == [2] and run_script.worlds_for(4) == [2, 4] and run_script.worlds_for(8) == [2, 4, 8]
    assert run_script.layouts(4) == [(4, 1), (4, 2), (4, 4)]


def test_plan_covers_the_grid_with_the_bench_s_cache_bytes():
    cases = _cases(H100_BYTES)
    assert len(cases) == 3 * 3 * 4
    for (context, batch, dcp), case in cases.items():
        settings = GraphBenchSettings(context=context, batches=(batch,), tp_size=dcp, dcp_size=dcp)
        assert case.alloc_bytes == settings.cache_bytes()
        assert case.cache_bytes == 61 * sum(settings.local_lengths(0)) * 576 * 2
        # The estimate: 61 layers x batch x context / dcp x 576 x 2 bytes (lengths are random within +-25%).
        assert case.cache_bytes == pytest.approx(61 * batch * context / dcp * 1152, rel=0.25 if batch == 1 else 0.1)
    for context in run_script.CONTEXTS:
        ratio = cases[context, 16, 2].cache_bytes / cases[context, 16, 1].cache_bytes
        assert 0.5 <= ratio < 0.501


def test_fit_decisions_follow_the_gpu_memory():
    h100, h200 = _cases(H100_BYTES), _cases(H200_BYTES)
    assert h100[131072, 1, 1].fits and h100[131072, 1, 2].fits and h100[524288, 1, 1].fits
    assert not h100[131072, 16, 1].fits and not h100[131072, 16, 2].fits and h100[131072, 16, 4].fits
    assert not h100[32768, 64, 2].fits and h100[32768, 64, 4].fits and h200[32768, 64, 2].fits
    assert not any(case.fits for key, case in h200.items() if key[0] == 524288 and key[1] == 64)
    for case in h100.values():
        assert case.fits == (case.alloc_bytes + run_script.HEADROOM_BYTES <= 0.85 * H100_BYTES)


def test_bench_runs_group_the_fitting_batches_and_name_torchrun(tmp_path):
    runs = run_script.bench_runs(_cases(H100_BYTES, contexts=(131072,)).values())
    assert runs == [run_script.BenchRun(131072, 1, (1,)), run_script.BenchRun(131072, 2, (1,)),
                    run_script.BenchRun(131072, 4, (1, 16)), run_script.BenchRun(131072, 8, (1, 16))]
    alone = run_script.bench_command(runs[0], tmp_path / "a.json", 100, 1)
    assert alone[:3] == [sys.executable, "-m", "mlakit.bench"] and "--tp-size" not in alone
    four = run_script.bench_command(runs[2], tmp_path / "b.json", 50, 16)
    assert four[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m"]
    text = " ".join(four)
    assert ("--graphs --graph-heads 128 --graph-context 131072 --graph-batches 1,16 --graph-steps 50 "
            f"--json {tmp_path / 'b.json'} --tp-size 4 --dcp-size 4 --dcp-interleave 16") in text


def test_every_child_gets_multicast_off_and_the_sources(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = run_script.child_env()
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"], env["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")
    assert env["PYTHONPATH"].split(":") == [str(ROOT / "src"), str(ROOT / "tests"), "/elsewhere"]


def test_children_are_cut_at_their_limit_and_failures_keep_their_log(tmp_path):
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    cut = run_script.run_command(sleeper, tmp_path / "sleep.log", (1.0, "deadline"))
    assert cut.returncode is None and cut.cut_by == "deadline" and "started" in cut.tail
    assert run_script.failure(cut, 1.0)["status"] == "not run"
    assert run_script.failure(run_script.Outcome(None, "case timeout", cut.tail), 1.0)["reason"] == "timed out after 1 s"
    broken = run_script.run_command([sys.executable, "-c", "import os; print(os.environ['NCCL_NVLS_ENABLE']); raise SystemExit(3)"],
                                    tmp_path / "exit.log", (30.0, "case timeout"))
    found = run_script.failure(broken, 0.1)
    assert found["status"] == "error" and found["reason"] == "exit status 3" and found["log_tail"] == "0"
    assert run_script.failure(run_script.Outcome(0, None, ""), 0.1) is None


def test_a_child_that_reported_but_does_not_exit_is_cut_soon(tmp_path):
    report = tmp_path / "rank0.json"
    hangs = [sys.executable, "-c", f"import time; open({str(report)!r}, 'w').write('{{}}'); time.sleep(60)"]
    began = time.monotonic()
    cut = run_script.run_command(hangs, tmp_path / "hang.log", (50.0, "case timeout"), report.exists, exit_grace_s=1.0)
    assert cut.returncode is None and cut.cut_by == run_script.HUNG_AT_EXIT and time.monotonic() - began < 40
    assert run_script.failure(cut, 2.0)["reason"].startswith("every rank wrote its report, but the processes did not exit")
    exits = [sys.executable, "-c", f"open({str(report)!r}, 'w').write('{{}}')"]
    assert run_script.run_command(exits, tmp_path / "exit.log", (50.0, "case timeout"), report.exists).returncode == 0


def test_a_piece_past_the_deadline_is_not_run(tmp_path):
    machine = run_script.Machine("cpu", 2, H100_BYTES, True)
    piece = run_script.run_world_part("attention", 2, machine, tmp_path, run_script.Clock(60, 0), (16, 2))
    assert piece["status"] == "not run" and "--deadline-s" in piece["reason"]
    assert run_script.Clock(60, None).limit() == (60, "case timeout")
    assert run_script.Clock(60, 30).limit()[1] == "deadline"


def _rows(tmp_path: Path, dcp2_ms: float, comm_ms: float) -> list[dict]:
    """Scaling rows at 128k as the script fills them from the bench's own JSON files."""
    cases = _cases(H100_BYTES, contexts=(131072,), batches=(1, 16), dcp_sizes=(1, 2))
    rows = {key: run_script.case_row(case, ["cmd"] if case.fits else None) for key, case in cases.items()}
    for dcp, result in ((1, _bench_result(1, 3.4)), (2, _bench_result(1, dcp2_ms, comm_ms))):
        path = tmp_path / f"dcp{dcp}.json"
        path.write_text(json.dumps(results_json(GraphBenchSettings(batches=(1,)), {"device": "x"}, [result])))
        run_script.settle(rows[131072, 1, dcp], run_script.measured(json.loads(path.read_text())["results"][0]))
    rows_list = list(rows.values())
    run_script.add_ratios(rows_list)
    return rows_list


def test_ratios_and_a_met_target(tmp_path):
    rows = _rows(tmp_path, dcp2_ms=1.9, comm_ms=0.3)
    one, two = (next(r for r in rows if (r["batch"], r["dcp"]) == (1, d)) for d in (1, 2))
    assert one["status"] == two["status"] == "ran" and "reason" not in two
    assert two["speedup_vs_1gpu"] == pytest.approx(3.4 / 1.9) and one["speedup_vs_1gpu"] == 1.0
    assert two["cache_ratio_vs_1gpu"] == pytest.approx(0.5, abs=1e-3)
    assert two["comm_share"] == pytest.approx(0.3 / 1.85) and one["comm_share"] is None and one["comm_ms"] is None
    verdicts = {v["batch"]: v for v in run_script.target_verdicts(rows)}
    assert verdicts[1]["verdict"] == "met" and verdicts[1]["speedup_met"] and verdicts[1]["cache_met"] and verdicts[1]["why"] is None
    assert verdicts[16]["verdict"] == "not run" and verdicts[16]["cache_met"]
    assert verdicts[16]["why"].startswith("DCP1 not run: the rank's caches")


def test_a_missed_target_says_where_the_time_went(tmp_path):
    rows = _rows(tmp_path, dcp2_ms=2.8, comm_ms=1.2)
    verdict = next(v for v in run_script.target_verdicts(rows) if v["batch"] == 1)
    assert verdict["verdict"] == "missed" and not verdict["speedup_met"] and verdict["cache_met"]
    assert "collectives 1.20 ms (44% of the replay)" in verdict["why"] and "(1.21x)" in verdict["why"]


def test_a_bench_run_fills_its_batches_from_its_json_even_when_it_fails(tmp_path, monkeypatch):
    """A stand-in bench writes the real bench's JSON for batch 1 only and exits 1."""
    written = tmp_path / "written.json"
    written.write_text(json.dumps(results_json(GraphBenchSettings(batches=(1,)), {}, [_bench_result(1, 2.0, 0.4)])))
    copy = "import shutil, sys; print('bench log'); shutil.copy(sys.argv[1], sys.argv[2]); raise SystemExit(1)"
    monkeypatch.setattr(run_script, "bench_command", lambda run, path, steps, interleave:
                        [sys.executable, "-c", copy, str(written), str(path)])
    run = run_script.BenchRun(131072, 4, (1, 16))
    cases = _cases(H100_BYTES, contexts=(131072,), batches=(1, 16), dcp_sizes=(4,))
    rows = {key: run_script.case_row(case, ["cmd"]) for key, case in cases.items()}
    run_script.run_bench(run, rows, tmp_path, run_script.Clock(60, None), 100, 1)
    one, sixteen = rows[131072, 1, 4], rows[131072, 16, 4]
    assert one["status"] == "ran" and one["graph_ms"] == 2.0 and one["comm_ms"] == 0.4 and "reason" not in one
    assert sixteen["status"] == "error" and sixteen["reason"] == "exit status 1" and sixteen["log_tail"] == "bench log"


def test_a_graph_that_differs_from_eager_is_an_error_row():
    row = run_script.measured(_bench_result(1, 2.0, 0.1, error=0.5).to_json())
    assert row["status"] == "error" and "relative error 5.0e-01" in row["reason"]


def _attention_report(out_err: float = 1e-6, holds: bool = True) -> dict:
    case = {"out_err": out_err, "lse_err": 1e-7, "out_tol": 1e-5, "slots_match_reserve": True, "cache_holds_own_tokens": holds,
            "local_lengths_match_cache": True}
    collectives = {"gather_err": 0.0, "merge_out_err": 0.0, "merge_lse_err": 0.0, "merge_lse_inf_match": True,
                   "unseen_query_zero": True}
    return {"tp2 dcp2: decode": case, "tp2 dcp2: collectives": collectives}


def test_correctness_summaries():
    good = run_script.summarize_attention([_attention_report(), _attention_report(3e-6)], "cpu")
    assert good["status"] == "pass" and good["max_out_err"] == 3e-6 and good["failed"] == []
    bad = run_script.summarize_attention([_attention_report(), _attention_report(holds=False)], "cuda")
    assert bad["status"] == "fail" and bad["failed"] == ["tp2 dcp2: decode"]
    layout = {"logit_errs": [1e-6, 2e-6], "logit_scale": 3.0, "interleave": 3, "greedy_equal": True, "sampled_equal": True,
              "tokens": 32}
    model = run_script.summarize_model([{"tp2 dcp2": layout}, {"tp2 dcp2": {**layout, "sampled_equal": False}}], "cuda")
    assert model["status"] == "fail" and model["layouts"]["tp2 dcp2"]["logit_tol"] == pytest.approx(3e-4)
    graph = {"backend": "triton", "graph": True,
             "checks": [{"eager_vs_one_device": 0.01, "replay_vs_eager": 0.0, "replay_vs_one_device": 0.01}]}
    assert run_script.summarize_graph([graph, graph], "cuda")["status"] == "pass"
    worse = {**graph, "checks": [{**graph["checks"][0], "replay_vs_eager": 0.1}]}
    assert run_script.summarize_graph([graph, worse], "cuda")["status"] == "fail"
    eager_only = {**graph, "graph": False, "checks": [{"eager_vs_one_device": 0.01}]}
    found = run_script.summarize_graph([eager_only], "cpu")
    assert found["status"] == "not run" and found["eager_step_pass"] and "CUDA graphs need a CUDA device" in found["reason"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Path]:
    """The dry run for 4 GPUs of an H100's memory, 128k context: its output, its results file."""
    folder = tmp_path_factory.mktemp("dry_run")
    out = folder / "dry.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "multi_gpu_run.py"), "--dry-run", "--gpus", "4", "--gpu-memory-gib",
         str(81559 / 1024), "--contexts", "131072", "--batches", "1,16", "--out", str(out), "--work-dir", str(folder / "work")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads(out.read_text()), out


def test_dry_run_prints_the_plan(dry_run):
    output, _, _ = dry_run
    assert "--standalone --nproc-per-node 4 -m mlakit.bench decode --graphs --graph-heads 128 --graph-context 131072" in output
    assert "context 131072 batch 16 DCP1:   149.3 GB, does not fit" in output
    assert "context 131072 batch 16 DCP4:    37.4 GB, fits" in output
    assert "multi_gpu_worker.py model 2 cpu" in output and "--model-heads 16" in output
    assert "'NCCL_NVLS_ENABLE': '0'" in output
    assert "target 131072 tokens, batch 1, DCP2" in output


def test_dry_run_checks_correctness_on_cpu_and_writes_the_results_file(dry_run):
    _, data, _ = dry_run
    assert sorted(data) == ["correctness", "environment", "scaling", "settings", "targets"]
    env = data["environment"]
    assert env["gpus"] == 4 and env["dry_run"] and env["torch"] and env["date"] and "nccl" in env and "triton" in env
    correctness = data["correctness"]
    assert correctness["process_group"] == "gloo" and correctness["passed"] is None  # the graph is not run on CPU
    parts = correctness["worlds"]["2"]
    assert parts["attention"]["status"] == "pass" and len(parts["attention"]["cases"]) == 2 * 6
    assert parts["model"]["status"] == "pass" and set(parts["model"]["layouts"]) == {"tp2 dcp1", "tp2 dcp2"}
    assert all(v["greedy_tokens_equal"] and v["sampled_tokens_equal"] for v in parts["model"]["layouts"].values())
    assert parts["graph"]["status"] == "not run" and parts["graph"]["eager_step_pass"]
    rows = data["scaling"]["rows"]
    assert len(rows) == 2 * 3 and all(r["status"] == "not run" for r in rows)
    assert {r["reason"] for r in rows if r["fits"]} == {"dry run: no GPU"}
    assert [v["verdict"] for v in data["targets"]] == ["not run", "not run"]


def test_resume_keeps_what_ran_and_refuses_another_device(dry_run, tmp_path):
    _, data, out = dry_run
    copy = tmp_path / "resumed.json"
    copy.write_text(out.read_text())
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "multi_gpu_run.py"), "--dry-run", "--gpus", "4", "--contexts", "131072",
         "--batches", "1,16", "--out", str(copy), "--resume", "--skip-correctness", "--skip-scaling",
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(copy.read_text())["correctness"] == data["correctness"]
    machine = run_script.Machine("NVIDIA H100 80GB HBM3", 4, H100_BYTES, False)
    with pytest.raises(run_script.click.ClickException, match="was written on dry run"):
        run_script.previous_pieces(copy, machine)
