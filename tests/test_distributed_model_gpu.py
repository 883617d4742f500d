"""The demo model under TP=2 and TP=2 x DCP=2 on a CUDA device (run on the device machine;
skipped without CUDA): two processes sharing one GPU over gloo, against one process and
transformers."""

from __future__ import annotations

import pytest
import torch

from dcp_worker import run_world
from mlakit.demo.checkpoint import ensure_demo_checkpoint
from mlakit.demo.verdict import gap_bound, teacher_forced_verdict
from mlakit.model.loader import load_model
from tp_worker import LAYOUTS, PROMPTS, generate, run_rank_on_device

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory):
    return ensure_demo_checkpoint(tmp_path_factory.mktemp("demo") / "model")


def test_tp2_and_dcp2_generation_on_one_gpu_equals_one_process(demo_dir, tmp_path) -> None:
    """float32 weights and cache on the GPU (the exact oracles): every rank's tokens are one process's."""
    reports = run_world(2, tmp_path, str(demo_dir), "cuda", "fp32", "auto", target=run_rank_on_device)
    alone = generate(load_model(demo_dir, device="cuda"), sampled=False, device="cuda", cache_dtype="fp32")
    for rank, report in enumerate(reports):
        assert set(report) == {f"tp{tp} dcp{dcp}" for tp, dcp, _ in LAYOUTS[2]}
        for case, tokens in report.items():
            assert tokens == alone, f"rank {rank} {case}"


def test_tp2_and_dcp2_with_a_bf16_cache_and_triton_decode_pass_the_demo_verdict(demo_dir, tmp_path) -> None:
    """bf16 cache, Triton decode (DCP: every query token through it): tokens are transformers'
    except at near-ties within the bf16 gap bound, as the one-GPU demo."""
    from transformers import AutoModelForCausalLM

    reports = run_world(2, tmp_path, str(demo_dir), "cuda", "bf16", "triton", target=run_rank_on_device)
    hf = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).to("cuda").eval()
    for rank, report in enumerate(reports):
        for case, tokens in report.items():
            verdict = teacher_forced_verdict(hf, PROMPTS, tokens, gap_bound("bf16"))
            assert verdict.passed, f"rank {rank} {case}: {verdict.summary()}"
