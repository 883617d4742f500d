"""The DeepSeek model under tensor parallelism and decode context parallelism, over gloo on CPU:
worlds of 2 and 4 processes (tests/tp_worker.py) against one process and transformers, on the
demo model (16 heads: 8 per rank at TP2, 4 at TP4) in float32."""

from __future__ import annotations

import pytest
import torch

from dcp_worker import run_world
from mlakit.demo.checkpoint import demo_hf_config, ensure_demo_checkpoint
from mlakit.demo.verdict import gap_bound, teacher_forced_verdict
from mlakit.model.loader import load_model
from tp_worker import LAYOUTS, PROMPTS, generate, run_rank

CASES = [(world, f"tp{tp} dcp{dcp}") for world, layouts in LAYOUTS.items() for tp, dcp, _ in layouts]
IDS = [f"world{world} {case}" for world, case in CASES]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory):
    return ensure_demo_checkpoint(tmp_path_factory.mktemp("demo") / "model")


@pytest.fixture(scope="module")
def reports(demo_dir, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict]]:
    """world size -> each rank's report."""
    return {world: run_world(world, tmp_path_factory.mktemp(f"tp_world{world}"), str(demo_dir), target=run_rank)
            for world in LAYOUTS}


@pytest.fixture(scope="module")
def one_process(demo_dir) -> dict[str, list[list[int]]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run; small ops on 2 threads took 100x longer on the CI machines
    try:
        model = load_model(demo_dir)
        return {"greedy": generate(model, sampled=False), "sampled": generate(model, sampled=True)}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("world", "case"), CASES, ids=IDS)
def test_logits_equal_one_process_in_decode_extend_and_mixed_steps(reports, world: int, case: str) -> None:
    for rank, report in enumerate(reports[world]):
        found = report[case]
        assert len(found["logit_errs"]) == 4
        assert max(found["logit_errs"]) <= 1e-5 * max(found["logit_scale"], 1.0), f"rank {rank}: {found['logit_errs']}"


@pytest.mark.parametrize(("world", "case"), CASES, ids=IDS)
def test_generation_equals_one_process_on_every_rank(reports, one_process, world: int, case: str) -> None:
    for rank, report in enumerate(reports[world]):
        assert report[case]["greedy"] == one_process["greedy"], f"rank {rank}"
        assert report[case]["sampled"] == one_process["sampled"], f"rank {rank}"


def test_one_process_generation_is_token_identical_to_transformers(demo_dir, one_process) -> None:
    """The TP / DCP tokens equal these (above), so they are transformers' tokens too."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    verdict = teacher_forced_verdict(hf, PROMPTS, one_process["greedy"], gap_bound("fp32"))
    assert verdict.total == sum(map(len, one_process["greedy"])) and not verdict.divergences, verdict.summary()


@pytest.mark.parametrize(("world", "case"), CASES, ids=IDS)
def test_each_rank_holds_its_heads(reports, world: int, case: str) -> None:
    tp = int(case.split()[0].removeprefix("tp"))
    for report in reports[world]:
        assert report[case]["heads_per_rank"] == 16 // tp
        config = demo_hf_config()
        assert report[case]["kv_b_rows"] == 16 // tp * (config["qk_nope_head_dim"] + config["v_head_dim"])


def test_zero_length_shards_are_covered(reports) -> None:
    for world, layouts in LAYOUTS.items():
        for tp, dcp, _ in layouts:
            if dcp > 1:
                assert sum(r[f"tp{tp} dcp{dcp}"]["empty_shards"] for r in reports[world]) > 0, f"world {world} tp{tp} dcp{dcp}"
