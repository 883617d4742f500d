"""Test set-up: Triton kernels run under the CPU interpreter where there is no GPU, tests
marked `gpu` are skipped without CUDA, every direct kernel launch is checked against Triton's own
choice of kernel (`mlakit.kernels.launch`), and pytest-xdist workers share the CPU's cores."""

import os
import sys
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MLAKIT_VERIFY_LAUNCHES", "1")

# Each xdist worker would otherwise start a torch thread per core: with 8 workers on 16 cores the
# big test batches' CPU work took minutes instead of seconds.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fuzz tests' probe counts per entry point (tests/fuzz_outcomes.py), when they ran."""
    outcomes = sys.modules.get("fuzz_outcomes")
    if outcomes is not None and outcomes.OUTCOMES:
        terminalreporter.section("fuzz probes")
        for line in outcomes.summary_lines():
            terminalreporter.write_line(line)


@pytest.fixture
def kernel_device() -> str:
    """Where Triton kernels run in tests: the GPU when there is one, else the CPU interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def fresh_prefill_plans() -> Iterator[None]:
    """Each test plans `triton_mha_prefill`'s launches afresh and leaves none behind: tests patch what planning reads
    (SM counts, tunings). Nothing to clear where the kernel module was never imported."""

    def forget() -> None:
        prefill = sys.modules.get("mlakit.kernels.triton_prefill")
        if prefill is not None:
            prefill._PLANS.clear()

    forget()
    yield
    forget()
