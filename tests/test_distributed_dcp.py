"""Decode context parallelism over gloo on CPU: worlds of 2 and 4 processes, started here.

Each world runs once (tests/dcp_worker.py: every layout and scenario inside); the tests
below check what each rank reported.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dcp_worker import LAYOUTS, SCENARIOS, run_readme_example, run_world

README = Path(__file__).resolve().parents[1] / "README.md"

CASES = [
    (world, f"tp{tp} dcp{dcp}: {scenario.name}")
    for world, layouts in LAYOUTS.items()
    for tp, dcp in layouts
    for scenario in SCENARIOS
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict]]:
    """world size -> each rank's report."""
    return {world: run_world(world, tmp_path_factory.mktemp(f"dcp_world{world}")) for world in LAYOUTS}


@pytest.mark.parametrize(("world", "case"), CASES, ids=[f"world{w} {c}" for w, c in CASES])
def test_dcp_attention_equals_one_process(reports: dict[int, list[dict]], world: int, case: str) -> None:
    for rank, report in enumerate(reports[world]):
        found = report[case]
        assert found["out_err"] <= found["out_tol"], f"rank {rank}: {found}"
        assert found["lse_err"] <= 1e-4, f"rank {rank}: {found}"
        assert found["out_dtype"] in ("torch.float32", "torch.bfloat16")


@pytest.mark.parametrize(("world", "case"), CASES, ids=[f"world{w} {c}" for w, c in CASES])
def test_cache_writes_go_to_the_owning_rank(reports: dict[int, list[dict]], world: int, case: str) -> None:
    for rank, report in enumerate(reports[world]):
        found = report[case]
        assert found["slots_match_reserve"], f"rank {rank}: the step's local slots are not the ones the cache reserved"
        assert found["cache_holds_own_tokens"], f"rank {rank}: the cache holds tokens it does not own, or misses some"
        assert found["local_lengths_match_cache"], f"rank {rank}: DCPStep.cache_seqlens differ from the cache's lengths"


def test_zero_length_shards_are_covered(reports: dict[int, list[dict]]) -> None:
    for world, layouts in LAYOUTS.items():
        for tp, dcp in layouts:
            if dcp > 1:
                empty = sum(r[f"tp{tp} dcp{dcp}: {s.name}"]["empty_shards"] for r in reports[world] for s in SCENARIOS)
                assert empty > 0, f"world {world} tp{tp} dcp{dcp}: no rank had an empty shard of a non-empty sequence"


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_collectives(reports: dict[int, list[dict]], world: int) -> None:
    for rank, report in enumerate(reports[world]):
        for tp, dcp in LAYOUTS[world]:
            found = report[f"tp{tp} dcp{dcp}: collectives"]
            assert found["gather_err"] == 0, f"rank {rank}: {found}"
            assert found["merge_out_err"] <= 1e-6 and found["merge_lse_err"] <= 1e-6, f"rank {rank}: {found}"
            assert found["merge_lse_inf_match"] and found["unseen_query_zero"], f"rank {rank}: {found}"


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_world_size_must_equal_tp_size(reports: dict[int, list[dict]], world: int) -> None:
    message = reports[world][0]["config errors"]["world size"]
    assert f"world size {world} does not equal tp_size={2 * world}" in message
    assert f"torchrun --nproc-per-node {2 * world}" in message and f"set tp_size={world}" in message


def test_readme_multi_gpu_example_runs_in_two_processes(tmp_path: Path) -> None:
    section = README.read_text().split("\n## Multi-GPU\n", 1)[1].split("\n## ", 1)[0]
    source = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    for rank, found in enumerate(run_world(2, tmp_path, source, target=run_readme_example)):
        assert found["out_shape"] == [2, 8, 512], f"rank {rank}: {found}"
        assert found["out_err"] < 2e-2 and found["lse_err"] < 1e-4, f"rank {rank}: {found}"
