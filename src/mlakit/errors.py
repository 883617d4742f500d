"""Exceptions raised by mlakit. Each message names the bad value, what was expected and the fix."""

import math
import numbers


class MLAKitError(Exception):
    """Base class of every error mlakit raises on purpose."""


class ConfigError(MLAKitError, ValueError):
    """A model shape or serving configuration that cannot be served as asked."""


class MLAInputError(MLAKitError, ValueError):
    """A tensor passed to an attention call has the wrong shape, dtype, device or contents."""


class CacheFullError(MLAKitError, RuntimeError):
    """The paged cache has too few free pages for a write; nothing was written."""


class WorkspaceError(MLAKitError, RuntimeError):
    """A workspace would have to grow where growing is not allowed (during CUDA-graph capture)."""


class FP8SaturationWarning(UserWarning):
    """An fp8 KV cache layer saturated values at +-448 or stored non-finite inputs as NaN."""


def is_int(value: object) -> bool:
    """Whether an argument is an integer (Python or NumPy); bools and floats are not.

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def checked_kv_tokens_hint(value: object) -> int | None:
    """`value` as a `kv_tokens_hint` argument takes it (the batch's cached tokens, known on the host): None, or a
    non-negative integer (Python or NumPy) as an int; anything else raises MLAInputError naming the argument.

    >>> checked_kv_tokens_hint(None), checked_kv_tokens_hint(4096)
    (None, 4096)
    """
    return _checked_count_hint("kv_tokens_hint", value, 0, "a non-negative int (the batch's cached tokens)")


def checked_page_size_hint(value: object) -> int | None:
    """`value` as a `page_size` hint takes it (the cache's tokens per page, where the caller knows it when it plans):
    None, or a positive integer as an int; anything else raises MLAInputError naming the argument.

    >>> checked_page_size_hint(None), checked_page_size_hint(64)
    (None, 64)
    """
    return _checked_count_hint("page_size", value, 1, "a positive int (the cache's tokens per page)")


def _checked_count_hint(name: str, value: object, minimum: int, expected: str) -> int | None:
    """A count hint `name` as given: None, or an integer (Python or NumPy) of at least `minimum` as an int; anything
    else raises MLAInputError naming the argument and what was `expected`."""
    if value is None:
        return None
    if not is_int(value) or value < minimum:
        raise MLAInputError(f"{name}: expected None or {expected}, got {value!r}")
    return int(value)


def divisors(n: int) -> list[int]:
    """The divisors of `n` >= 1 in increasing order, found in O(sqrt(n)) steps (so an error
    message can list them even for a config with a billion heads).

    >>> divisors(12), divisors(1_000_000_000)[-3:]
    ([1, 2, 3, 4, 6, 12], [250000000, 500000000, 1000000000])
    """
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
