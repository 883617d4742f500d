"""Test set-up: Triton kernels run under the CPU interpreter where there is no GPU, and
tests marked `gpu` are skipped without CUDA."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def kernel_device() -> str:
    """Where Triton kernels run in tests: the GPU when there is one, else the CPU interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"
