"""Shared machinery of the fuzz tests (tests/test_fuzz_*.py): run one probe, judge and count its outcome.

A probe calls a public entry point with one malformed (mutated) input. It must end in an
mlakit error (`MLAKitError`) whose message names the mutated argument, or, for a mutation
that is legitimately valid, in a result the test checks against an oracle. Anything else
(IndexError, a torch RuntimeError, KeyError, ...) fails the test. Outcomes are counted per
entry point; conftest.py prints the counts after a run, and

    .venv/bin/python tests/fuzz_outcomes.py

runs just the fuzz tests and prints them.
"""

from __future__ import annotations

import collections
import contextlib
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from hypothesis import HealthCheck, settings

from mlakit.errors import MLAKitError

CLEAR_ERROR, CORRECT_RESULT, OTHER = "clear error", "correct result", "other"
OUTCOMES: collections.Counter[tuple[str, str]] = collections.Counter()

# Deterministic examples (CI runs the same probes every time), no deadline: the interpreter and
# the model runs are slow on small machines, and a probe's cost is not what is being tested.
FUZZ = settings(derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

T = TypeVar("T")


def names(message: str, argument: str) -> bool:
    """Whether `message` starts with `argument` or names it as a whole word.

    >>> names("q: expected 3 dims", "q"), names("max_q_len: expected >= 2", "q"), names("equal q's 3 tokens", "q")
    (True, False, False)
    >>> names("missing the required key 'vocab_size'", "vocab_size")
    True
    """
    return message.startswith(argument) or re.search(rf"(?<!\w){re.escape(argument)}(?!\w|'s)", message) is not None


def probe(
    entry: str, blamed: Sequence[str] | None, call: Callable[[], T], check: Callable[[T], None] | None = None
) -> MLAKitError | None:
    """Runs `call()` once, counts the outcome under `entry` and returns the error, if any.

    `blamed` lists the names an error may name (None: the mutation is valid and `call` must
    return); `check` judges a returned result (it raises AssertionError when the result is wrong).
    """
    try:
        result = call()
    except MLAKitError as exc:
        OUTCOMES[entry, CLEAR_ERROR] += 1
        assert blamed is not None, f"{entry}: a valid input was refused: {exc}"
        assert "\n" not in str(exc).strip(), f"{entry}: the message is not one line: {exc}"
        assert any(names(str(exc), name) for name in blamed), f"{entry}: the error names none of {list(blamed)}: {exc}"
        return exc
    except Exception:
        OUTCOMES[entry, OTHER] += 1
        raise
    OUTCOMES[entry, CORRECT_RESULT] += 1
    assert check is not None, f"{entry}: expected an error naming one of {list(blamed or [])}, got a result"
    check(result)
    return None


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Raises TimeoutError in the block after `seconds` (a hang fails the probe instead of the run)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Copies of `tensors` for `assert_unchanged` (bits, so NaN rows compare equal)."""
    return [None if t is None else t.detach().clone() for t in tensors]


def assert_unchanged(before: list[torch.Tensor | None], *tensors: torch.Tensor | None) -> None:
    """Every tensor holds the same bits as its snapshot."""
    for old, new in zip(before, tensors, strict=True):
        if old is None or new is None:
            assert old is new
            continue
        assert old.shape == new.shape and torch.equal(_bits(old), _bits(new)), "a refused call changed a tensor"


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def summary_lines() -> list[str]:
    """One line per entry point: probes and outcomes, then the total."""
    entries = sorted({entry for entry, _ in OUTCOMES})
    lines = [_line(entry, [OUTCOMES[entry, kind] for kind in (CLEAR_ERROR, CORRECT_RESULT, OTHER)]) for entry in entries]
    totals = [sum(OUTCOMES[entry, kind] for entry in entries) for kind in (CLEAR_ERROR, CORRECT_RESULT, OTHER)]
    return lines + [_line("all entry points", totals)]


def _line(entry: str, counts: list[int]) -> str:
    errors, results, other = counts
    return f"{entry}: {sum(counts)} probes: {errors} clear errors, {results} correct results, {other} other"


if __name__ == "__main__":
    import pytest

    tests = sorted(str(path) for path in Path(__file__).parent.glob("test_fuzz_*.py"))
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *tests]))
