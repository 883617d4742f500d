"""`mlakit demo`: it passes on this machine's path, its verdict fails when attention is wrong, and on a
GPU it passes with every installed decode backend and cache dtype."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from rich.console import Console

from mlakit.demo.checkpoint import ensure_demo_checkpoint
from mlakit.demo.run import run_model_demo


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_checkpoint(tmp_path_factory.mktemp("demo") / "checkpoint")


def _demo(demo_dir, device: str, **options) -> tuple[int, str]:
    console = Console(record=True, width=200)
    code = run_model_demo(device, console, directory=demo_dir, **options)
    return code, console.export_text()


def test_cpu_demo_matches_transformers_token_for_token(demo_dir):
    code, text = _demo(demo_dir, "cpu")
    assert code == 0, text
    assert "verdict (decode reference, prefill reference, weights float32, KV cache fp32, on cpu): 64/64 tokens identical" in text


def test_cpu_demo_with_an_fp8_cache_passes_within_its_bound(demo_dir):
    code, text = _demo(demo_dir, "cpu", kv_cache_dtype="fp8_e4m3")
    assert code == 0, text
    assert "KV cache fp8_e4m3" in text and "tokens identical to transformers" in text


def test_verdict_fails_when_attention_is_wrong(demo_dir, monkeypatch):
    import mlakit.model.mla_attention as layer

    correct = layer.mla_forward

    def too_sharp(*args, softmax_scale, **kwargs):
        return correct(*args, softmax_scale=4 * softmax_scale, **kwargs)

    monkeypatch.setattr(layer, "mla_forward", too_sharp)
    code, text = _demo(demo_dir, "cpu")
    assert code == 1
    assert "OUTSIDE the bound 0.0001" in text


def test_demo_fails_when_an_output_stops_early_without_eos(demo_dir, monkeypatch):
    """Before: the verdict compared only the tokens that came, so truncated outputs passed."""
    from mlakit.model.runner import Runner

    generate = Runner.generate
    monkeypatch.setattr(Runner, "generate", lambda self, requests: [out[:3] for out in generate(self, requests)])
    code, text = _demo(demo_dir, "cpu")
    assert code == 1
    assert "12/12 tokens identical" in text and "stop before 16 tokens without an EOS token" in text


GPU_RUNS = [("triton", "bf16"), ("triton", "fp8_e4m3"), ("triton_fp8", "fp8_e4m3"), ("flashmla", "bf16")]


@pytest.mark.gpu
@pytest.mark.parametrize("backend, kv_cache_dtype", GPU_RUNS)
def test_gpu_demo_passes_with_each_installed_decode_backend(demo_dir, backend, kv_cache_dtype):
    if backend == "flashmla" and importlib.util.find_spec("flash_mla") is None:
        pytest.skip("flash_mla is not installed")
    code, text = _demo(demo_dir, "cuda", decode_backend=backend, kv_cache_dtype=kv_cache_dtype)
    print(text)
    assert code == 0, text
    assert f"decode {backend}" in text and f"KV cache {kv_cache_dtype}" in text and "weights bfloat16" in text


@pytest.mark.gpu
def test_gpu_demo_with_the_fp8_prefill_passes_within_the_e4m3_bound(demo_dir):
    code, text = _demo(demo_dir, "cuda", prefill_backend="triton_fp8")
    print(text)
    assert code == 0, text
    assert "prefill triton_fp8" in text.replace("\n", " ")


def test_a_damaged_cached_checkpoint_is_rebuilt_with_one_line_saying_so(tmp_path):
    """Issue 27: the demo reused a damaged cached checkpoint forever."""
    directory = ensure_demo_checkpoint(tmp_path / "checkpoint", say=pytest.fail)
    shard = directory / "model.safetensors"
    original = shard.read_bytes()
    ensure_demo_checkpoint(directory, say=pytest.fail)  # an intact checkpoint is reused silently
    shard.write_bytes(original[: len(original) // 2])
    said: list[str] = []
    ensure_demo_checkpoint(directory, say=said.append)
    assert said == [f"demo checkpoint {directory} is damaged (model.safetensors: expected {len(original)} bytes with the "
                    f"stamped SHA-256, got {len(original) // 2} bytes); rebuilding it"]
    assert shard.read_bytes() == original
