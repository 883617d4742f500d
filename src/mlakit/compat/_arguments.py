"""Helpers the compat entry points share for checking arguments and naming what came."""

from __future__ import annotations

import torch

from mlakit.errors import is_int


def is_positive_int(value: object) -> bool:
    """Whether `value` is an integer >= 1 (bools are not).

    >>> is_positive_int(4), is_positive_int(0), is_positive_int(True), is_positive_int(4.0)
    (True, False, False, False)
    """
    return is_int(value) and value >= 1


def is_flag(value: object) -> bool:
    """Whether `value` can stand for a bool argument: a bool, a NumPy bool, or an integer 0 or 1 (strings and floats
    cannot: "False" would be true).

    >>> is_flag(True), is_flag(1), is_flag(2), is_flag("False"), is_flag(1.0)
    (True, True, False, False, False)
    """
    return (isinstance(value, bool) or is_int(value) or type(value).__name__ == "bool_") and value in (0, 1)


def describe(value: object) -> str:
    """What came, for an error message: a tensor's dtype, shape and device, else the value's repr.

    >>> describe(torch.zeros(2, 3, dtype=torch.int32)), describe(None)
    ('a torch.int32 tensor of shape [2, 3] on cpu', 'None')
    """
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)} on {value.device}"
    return repr(value)
